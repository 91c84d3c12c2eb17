"""``stormguard-server``: run the reference server from the command line.

Every flag maps to one field of the config dataclasses (config.py); ``--help``
explains each. The admin endpoint, when asked for, is a second uvicorn server
bound to 127.0.0.1 only, behind a bearer token (``--admin-token``, else
``$STORMGUARD_ADMIN_TOKEN``, else a random one logged once at start).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import secrets
import sys
from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING

import uvicorn

from stormguard import __version__
from stormguard_server.admin import create_admin_app
from stormguard_server.admin_guard import ADMIN_TOKEN_ENV, check_token
from stormguard_server.app import build_state, create_app
from stormguard_server.config import AdmissionConfig, FaultConfig, ServerConfig, SimEngineConfig
from stormguard_server.connections import (
    ConnectionLimits,
    fit_to_fd_limit,
    summarize_accept_failures,
    uvicorn_config,
)
from stormguard_server.logs import configure_logging
from stormguard_server.memory import return_freed_buffers_to_os

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from stormguard_server.state import ServerState

logger = logging.getLogger("stormguard_server")

_ENGINE = SimEngineConfig()
_ADMISSION = AdmissionConfig()
_SERVER = ServerConfig()


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if not 0.0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not 0.0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be within 0..1, got {text}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port: {value}")
    return value


def _admin_token(text: str) -> str:
    try:
        return check_token(text)
    except ValueError as exc:  # its message never quotes the token
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stormguard-server",
        description="OpenAI-compatible reference server: a simulated continuous-batching "
        "engine with a paged KV cache and faults, behind token-weighted admission that sheds "
        "load with honest Retry-After and load headers on every response.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")

    http = parser.add_argument_group("HTTP")
    http.add_argument("--host", default=_SERVER.host, help="address to listen on")
    http.add_argument("--port", type=_port, default=_SERVER.port, help="port (0 = any free port)")
    http.add_argument(
        "--max-body-bytes",
        type=_positive_int,
        default=_SERVER.max_body_bytes,
        help="request bodies larger than this get 413",
    )
    http.add_argument(
        "--header-timeout-s",
        type=_positive_seconds,
        default=_SERVER.header_timeout_s,
        help="a connection that has not sent complete request headers this long after "
        "connecting (or after its previous response) is closed",
    )
    http.add_argument(
        "--body-timeout-s",
        type=_positive_seconds,
        default=_SERVER.body_timeout_s,
        help="a request whose body has not fully arrived this long after its headers gets "
        "408 and its connection is closed",
    )
    http.add_argument(
        "--max-connections",
        type=_positive_int,
        default=_SERVER.max_connections,
        help="most open connections; past it a new one closes the connection idle longest "
        "(or is closed itself when none is idle). Lowered to fit the file-descriptor limit",
    )
    http.add_argument(
        "--max-concurrent-requests",
        type=_positive_int,
        default=_SERVER.max_concurrent_requests,
        help="most requests served at once (from complete headers to the end of the "
        "answer); past it: 503 with Retry-After, connection closed",
    )
    http.add_argument(
        "--max-buffered-body-bytes",
        type=_positive_int,
        default=_SERVER.max_buffered_body_bytes,
        help="most request-body bytes held by the requests being served (Content-Length, "
        "or --max-body-bytes when chunked); past it: 503 with Retry-After. At least "
        "--max-body-bytes",
    )
    http.add_argument(
        "--admin-port",
        type=_port,
        default=None,
        help="serve the fault admin endpoint on 127.0.0.1:PORT (off when not given). Every "
        "request needs 'Authorization: Bearer TOKEN', a Host and any Origin naming 127.0.0.1, "
        "[::1] or localhost, and Content-Type: application/json unless it is a GET",
    )
    http.add_argument(
        "--admin-token",
        type=_admin_token,
        default=None,
        metavar="TOKEN",
        help="the admin endpoint's bearer token, 16+ visible ASCII characters; "
        f"${ADMIN_TOKEN_ENV} is better (argv shows in ps). Neither given: a random token, "
        "logged once at start (event admin_token)",
    )
    http.add_argument("--access-log", action="store_true", help="log every request (noisy)")
    http.add_argument(
        "--otlp-endpoint",
        default=None,
        metavar="URL",
        help="export server spans over OTLP/HTTP to this collector base URL, e.g. "
        "http://localhost:4318 (needs the otlp extra; off when not given)",
    )
    http.add_argument(
        "--log-level",
        default=_SERVER.log_level,
        choices=["debug", "info", "warning", "error"],
        help="log level",
    )
    http.add_argument(
        "--log-format",
        default="json",
        choices=["json", "text"],
        help="json: one JSON object per line; text: plain lines",
    )

    engine = parser.add_argument_group("engine (sim)")
    engine.add_argument(
        "--engine",
        default="sim",
        choices=["sim", "vllm"],
        help="engine behind the admission layer: the embedded simulator, or real vLLM"
        " (then --model is a model path or name, and flags this CLI does not know are"
        " passed to vLLM; see docs/vllm.md)",
    )
    engine.add_argument(
        "--model", default=_ENGINE.model, help="served model name (vllm: model path or name)"
    )
    engine.add_argument(
        "--model-alias",
        action="append",
        default=[],
        help="another model name served by the same engine (repeatable)",
    )
    engine.add_argument(
        "--embedding-dimensions",
        type=_positive_int,
        default=_SERVER.embedding_dimensions,
        help="length of the vectors /v1/embeddings returns (a request's `dimensions` "
        "may ask for fewer)",
    )
    engine.add_argument(
        "--max-model-len",
        type=_positive_int,
        default=_ENGINE.max_model_len,
        help="context length: prompt + max_tokens above this is a 400",
    )
    engine.add_argument(
        "--block-size", type=_positive_int, default=_ENGINE.block_size, help="tokens per KV block"
    )
    engine.add_argument(
        "--num-kv-blocks",
        type=_positive_int,
        default=_ENGINE.num_kv_blocks,
        help="KV blocks (capacity = blocks x block size tokens)",
    )
    engine.add_argument(
        "--max-num-seqs",
        type=_positive_int,
        default=_ENGINE.max_num_seqs,
        help="most sequences in the running batch",
    )
    engine.add_argument(
        "--max-num-batched-tokens",
        type=_positive_int,
        default=_ENGINE.max_num_batched_tokens,
        help="token budget of one step (prefill chunks + one per decoding sequence)",
    )
    engine.add_argument(
        "--step-base-ms",
        type=_non_negative,
        default=_ENGINE.step_base_s * 1e3,
        help="cost model: fixed time of every step",
    )
    engine.add_argument(
        "--prefill-token-us",
        type=_non_negative,
        default=_ENGINE.prefill_token_s * 1e6,
        help="cost model: time per prefilled token",
    )
    engine.add_argument(
        "--decode-seq-us",
        type=_non_negative,
        default=_ENGINE.decode_seq_s * 1e6,
        help="cost model: time per decoding sequence in a step",
    )
    engine.add_argument(
        "--oom",
        action=argparse.BooleanOptionalAction,
        default=_ENGINE.oom_crash,
        help="a KV allocation that does not fit crashes the engine (the seed's OOM); "
        "--no-oom preempts like vLLM instead",
    )
    engine.add_argument(
        "--restart-s",
        type=_non_negative,
        default=_ENGINE.restart_s,
        help="cold-restart time after a crash (/ready is false meanwhile)",
    )
    engine.add_argument(
        "--warmup-probe-tokens",
        type=_positive_int,
        default=_ENGINE.warmup_probe_tokens,
        help="tokens the warm-up probe generates before the engine is ready",
    )
    engine.add_argument(
        "--slow-start-s",
        type=_non_negative,
        default=_ENGINE.slow_start_s,
        help="after a restart, batch size and admission budget ramp up over this long",
    )
    engine.add_argument(
        "--slow-start-floor",
        type=_fraction,
        default=_ENGINE.slow_start_floor,
        help="fraction of capacity at the start of the ramp",
    )
    engine.add_argument(
        "--restart-loop-window-s",
        type=_non_negative,
        default=_ENGINE.restart_loop_period_s,
        help="a crash this soon after the engine came back counts as a restart loop",
    )
    engine.add_argument(
        "--natural-output-tokens",
        type=_positive_int,
        default=_ENGINE.natural_output_tokens,
        help="typical completion length without ignore_eos (0.5x..1.5x, per prompt)",
    )
    engine.add_argument("--seed", type=int, default=_ENGINE.seed, help="seed of text and faults")

    faults = parser.add_argument_group("faults (sim)")
    faults.add_argument(
        "--error-rate",
        type=_fraction,
        default=0.0,
        help="fraction of requests failing with an injected 500",
    )
    faults.add_argument(
        "--added-latency-ms",
        type=_non_negative,
        default=0.0,
        help="delay before each request enters the engine",
    )
    faults.add_argument(
        "--stall-s",
        type=_non_negative,
        default=0.0,
        help="freeze the engine for this long at start",
    )

    adm = parser.add_argument_group("admission")
    adm.add_argument(
        "--admission",
        default="on",
        choices=["on", "off"],
        help="off: plain engine behaviour (unbounded FIFO, no shedding, no load headers)",
    )
    adm.add_argument(
        "--kv-watermark",
        type=_fraction,
        default=_ADMISSION.kv_watermark,
        help="admission budget = KV capacity tokens x this",
    )
    adm.add_argument(
        "--max-queue-requests",
        type=_positive_int,
        default=_ADMISSION.max_queue_requests,
        help="most requests waiting for admission (then queue_full)",
    )
    adm.add_argument(
        "--max-queue-tokens",
        type=_positive_int,
        default=_ADMISSION.max_queue_tokens,
        help="most token cost waiting for admission (then token_budget)",
    )
    adm.add_argument(
        "--max-queue-wait-s",
        type=_non_negative,
        default=_ADMISSION.max_queue_wait_s,
        help="longest wait in the queue before a request is shed",
    )
    adm.add_argument(
        "--retry-queue-fraction",
        type=_fraction,
        default=_ADMISSION.retry_queue_fraction,
        help="a retry that would queue behind more than this fraction of the request limit "
        "is shed at once (retry_shed)",
    )
    adm.add_argument(
        "--min-retry-after-ms",
        type=_non_negative,
        default=_ADMISSION.min_retry_after_s * 1e3,
        help="smallest Retry-After sent",
    )
    adm.add_argument(
        "--max-retry-after-s",
        type=_non_negative,
        default=_ADMISSION.max_retry_after_s,
        help="largest Retry-After sent",
    )
    adm.add_argument(
        "--drain-window-s",
        type=_non_negative,
        default=_ADMISSION.drain_period_s,
        help="seconds of releases over which the hold times behind Retry-After are measured",
    )
    return parser


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
        max_body_bytes=args.max_body_bytes,
        header_timeout_s=args.header_timeout_s,
        body_timeout_s=args.body_timeout_s,
        max_connections=args.max_connections,
        max_concurrent_requests=args.max_concurrent_requests,
        max_buffered_body_bytes=args.max_buffered_body_bytes,
        access_log=args.access_log,
        log_level=args.log_level,
        otlp_endpoint=args.otlp_endpoint,
        model_aliases=tuple(args.model_alias),
        embedding_dimensions=args.embedding_dimensions,
        engine=engine,
        faults=faults,
        admission=admission,
    )


#: Connections the admin server keeps open at once (it serves a script or two).
_ADMIN_MAX_CONNECTIONS = 64


class _AdminServer(uvicorn.Server):
    """The admin server leaves signals to the main server, which stops it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


async def serve(config: ServerConfig) -> None:
    """Run the main server (and the admin server, if enabled) until interrupted."""
    with _tracing(config) as tracer_provider:
        await _serve(build_state(config, tracer_provider=tracer_provider))


@contextlib.contextmanager
def _tracing(config: ServerConfig) -> Generator[TracerProvider | None, None, None]:
    """The OTLP tracer provider of ``--otlp-endpoint`` (flushed at exit), or None."""
    if config.otlp_endpoint is None:
        yield None
        return
    from stormguard.telemetry import configure_otlp

    setup = configure_otlp(
        config.otlp_endpoint, service_name="stormguard-server", metrics=False, set_global=False
    )
    try:
        yield setup.tracer_provider
    finally:
        setup.shutdown()


async def _serve(state: ServerState) -> None:
    config = state.config
    return_freed_buffers_to_os()
    summarize_accept_failures(asyncio.get_running_loop())
    main = uvicorn.Server(
        uvicorn_config(
            create_app(state=state),
            host=config.host,
            port=config.port,
            limits=ConnectionLimits(
                header_timeout_s=config.header_timeout_s,
                body_timeout_s=config.body_timeout_s,
                max_connections=fit_to_fd_limit(config.max_connections),
            ),
            registry=state.metrics.registry,
            log_config=None,
            access_log=config.access_log,
            timeout_graceful_shutdown=2,
            backlog=4096,
        )
    )
    logger.info(
        "starting stormguard-server",
        extra={
            "event": "server_start",
            "host": config.host,
            "port": config.port,
            "admission": config.admission.enabled,
            "kv_capacity_tokens": config.engine.kv_capacity_tokens,
            "oom_crash": config.engine.oom_crash,
            "admin_port": config.admin_port,
        },
    )
    if config.admin_port is None:
        await main.serve()
        return
    admin = _AdminServer(
        uvicorn_config(
            create_admin_app(state, token=config.admin_token or _new_admin_token()),
            host="127.0.0.1",  # never configurable: faults are not for the network
            port=config.admin_port,
            # The same slow-client bounds; a handful of connections is all it needs.
            limits=ConnectionLimits(
                header_timeout_s=config.header_timeout_s,
                body_timeout_s=config.body_timeout_s,
                max_connections=_ADMIN_MAX_CONNECTIONS,
            ),
            log_config=None,
            access_log=config.access_log,
            lifespan="off",
        )
    )
    admin_task = asyncio.create_task(admin.serve())
    try:
        await main.serve()
    finally:
        admin.should_exit = True
        await admin_task


def _new_admin_token() -> str:
    """A random admin token, logged once: the only place it is ever written."""
    token = secrets.token_urlsafe(32)
    # At any --log-level: without this line nobody can use the endpoint.
    logger.log(
        max(logging.INFO, logger.getEffectiveLevel()),
        f"admin token: {token}",
        extra={"event": "admin_token", "admin_token": token},
    )
    return token


def _admin_token_from_env(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
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


# Engine flags that mean the same to the simulator and to vLLM: given explicitly
# with --engine vllm, they are passed on (their sim defaults are not).
_SHARED_ENGINE_FLAGS = ("--max-model-len", "--max-num-seqs", "--max-num-batched-tokens", "--seed")


def _shared_engine_flags(args: argparse.Namespace, argv: Sequence[str] | None) -> list[str]:
    given = list(sys.argv[1:] if argv is None else argv)
    out: list[str] = []
    for flag in _SHARED_ENGINE_FLAGS:
        if any(arg == flag or arg.startswith(flag + "=") for arg in given):
            out += [flag, str(getattr(args, flag.lstrip("-").replace("-", "_")))]
    return out


# The bounds on slow and hostile clients belong to this server's HTTP layer;
# with --engine vllm, vLLM serves HTTP itself (docs/server.md: what holds there).
_SIM_HTTP_LIMITS = (
    "header_timeout_s",
    "body_timeout_s",
    "max_connections",
    "max_concurrent_requests",
    "max_buffered_body_bytes",
)


def _check_http_limits(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.engine == "vllm":
        for name in _SIM_HTTP_LIMITS:
            if getattr(args, name) != getattr(_SERVER, name):
                flag = "--" + name.replace("_", "-")
                parser.error(f"{flag} needs --engine sim: vLLM serves HTTP itself")
    elif args.max_buffered_body_bytes < args.max_body_bytes:
        parser.error("--max-buffered-body-bytes must be at least --max-body-bytes")


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    _check_http_limits(parser, args)
    _admin_token_from_env(parser, args)
    if args.engine == "vllm":
        from stormguard_server.vllm.launch import launch

        config = config_from_args(args)
        launch(
            model=args.model,
            host=config.host,
            port=config.port,
            admission=config.admission,
            extra_args=[*_shared_engine_flags(args, argv), *rest],
        )
        return
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    configure_logging(args.log_level, args.log_format)
    # uvicorn stops gracefully on Ctrl-C, then raises the signal again once the
    # servers are down: that is the end of the run, not an error to print.
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(config_from_args(args)))


if __name__ == "__main__":
    main()
