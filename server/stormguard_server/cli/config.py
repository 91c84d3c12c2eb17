"""From the parsed flags of ``stormguard-server`` to its config: the
``ServerConfig`` they describe, the checks across flags that argparse cannot
make, and the engine flags passed on to vLLM."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from stormguard_server.cli.quota import quota_config
from stormguard_server.config import (
    AdmissionConfig,
    FaultConfig,
    PriorityTrustConfig,
    ServerConfig,
    SimEngineConfig,
)
from stormguard_server.guards.admin_guard import ADMIN_TOKEN_ENV, check_token
from stormguard_server.guards.priority_trust import PRIORITY_TOKEN_ENV

#: The HTTP flags' defaults (cli.flags reads the same dataclass): a limit left
#: at its default was not given.
_SERVER = ServerConfig()


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The ServerConfig the parsed flags describe."""
    engine = SimEngineConfig(
        model=args.model,
        max_model_len=args.max_model_len,
        block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        step_base_s=args.step_base_ms / 1e3,
        prefill_token_s=args.prefill_token_us / 1e6,
        decode_seq_s=args.decode_seq_us / 1e6,
        oom_crash=args.oom,
        prefix_caching=args.prefix_caching,
        restart_s=args.restart_s,
        warmup_probe_tokens=args.warmup_probe_tokens,
        slow_start_s=args.slow_start_s,
        slow_start_floor=args.slow_start_floor,
        restart_loop_period_s=args.restart_loop_window_s,
        natural_output_tokens=args.natural_output_tokens,
        seed=args.seed,
    )
    faults = FaultConfig(
        error_rate=args.error_rate,
        hang_rate=args.hang_rate,
        added_latency_s=args.added_latency_ms / 1e3,
        stall_s=args.stall_s,
        seed=args.seed,
    )
    admission = AdmissionConfig(
        enabled=args.admission == "on",
        kv_watermark=args.kv_watermark,
        max_queue_requests=args.max_queue_requests,
        max_queue_tokens=args.max_queue_tokens,
        max_queue_wait_s=args.max_queue_wait_s,
        retry_queue_fraction=args.retry_queue_fraction,
        min_retry_after_s=args.min_retry_after_ms / 1e3,
        max_retry_after_s=args.max_retry_after_s,
        drain_period_s=args.drain_window_s,
    )
    return ServerConfig(
        host=args.host,
        port=args.port,
        admin_port=args.admin_port,
        admin_token=args.admin_token,
        port_file=args.port_file,
        max_body_bytes=args.max_body_bytes,
        header_timeout_s=args.header_timeout_s,
        body_timeout_s=args.body_timeout_s,
        max_connections=args.max_connections,
        max_concurrent_requests=args.max_concurrent_requests,
        max_buffered_body_bytes=args.max_buffered_body_bytes,
        max_header_bytes=args.max_header_bytes,
        max_header_count=args.max_header_count,
        priority_trust=PriorityTrustConfig(
            networks=tuple(args.trust_priority_from),
            token=args.priority_token,
            forwarded_from=tuple(args.trust_forwarded_from),
        ),
        access_log=args.access_log,
        log_level=args.log_level,
        otlp_endpoint=args.otlp_endpoint,
        model_aliases=tuple(args.model_alias),
        embedding_dimensions=args.embedding_dimensions,
        engine=engine,
        faults=faults,
        admission=admission,
        quota=quota_config(args),
    )


def admin_token_from_env(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``$STORMGUARD_ADMIN_TOKEN`` when ``--admin-token`` is not given (checked the same way;
    ignored without ``--admin-port``, so a shell may keep it set for every run)."""
    if args.admin_port is None:
        if args.admin_token is not None:
            parser.error("--admin-token needs --admin-port")
        return
    text = os.environ.get(ADMIN_TOKEN_ENV)
    if args.admin_token is None and text is not None:
        try:
            args.admin_token = check_token(text)
        except ValueError as exc:
            parser.error(f"${ADMIN_TOKEN_ENV}: {exc}")


def priority_token_from_env(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``$STORMGUARD_PRIORITY_TOKEN`` when ``--priority-token`` is not given (checked the
    same way)."""
    text = os.environ.get(PRIORITY_TOKEN_ENV)
    if args.priority_token is None and text:
        try:
            args.priority_token = check_token(text, what="a priority token")
        except ValueError as exc:
            parser.error(f"${PRIORITY_TOKEN_ENV}: {exc}")


# Engine flags that mean the same to the simulator and to vLLM: given explicitly
# with --engine vllm, they are passed on (their sim defaults are not).
_SHARED_ENGINE_FLAGS = ("--max-model-len", "--max-num-seqs", "--max-num-batched-tokens", "--seed")


def shared_engine_flags(args: argparse.Namespace, argv: Sequence[str] | None) -> list[str]:
    """The shared engine flags given in ``argv``, with their parsed values, for vLLM."""
    given = list(sys.argv[1:] if argv is None else argv)
    out: list[str] = []
    for flag in _SHARED_ENGINE_FLAGS:
        if any(arg == flag or arg.startswith(flag + "=") for arg in given):
            out += [flag, str(getattr(args, flag.lstrip("-").replace("-", "_")))]
    return out


# The bounds on slow and hostile clients, and the report of the ports bound, belong
# to this server's HTTP layer; with --engine vllm, vLLM serves HTTP itself
# (docs/server.md: what holds there).
_SIM_HTTP_LIMITS = (
    "port_file",
    "header_timeout_s",
    "body_timeout_s",
    "max_connections",
    "max_concurrent_requests",
    "max_buffered_body_bytes",
    "max_header_bytes",
    "max_header_count",
)


def check_http_limits(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse a slow-client bound that cannot hold (vLLM serves HTTP itself), and a
    body pool smaller than one body."""
    if args.engine == "vllm":
        for name in _SIM_HTTP_LIMITS:
            if getattr(args, name) != getattr(_SERVER, name):
                flag = "--" + name.replace("_", "-")
                parser.error(f"{flag} needs --engine sim: vLLM serves HTTP itself")
    elif args.max_buffered_body_bytes < args.max_body_bytes:
        parser.error("--max-buffered-body-bytes must be at least --max-body-bytes")
