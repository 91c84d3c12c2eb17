"""The flags of ``stormguard-server``: each one's type, default and help.

A flag's default is read from the config dataclasses (``stormguard_server.config``)
wherever it sets one of their fields, so the two cannot drift; ``--help`` explains
each. ``cli.config`` turns the parsed flags into a ``ServerConfig``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from stormguard import __version__
from stormguard_server.cli.quota import add_quota_flags
from stormguard_server.config import AdmissionConfig, ServerConfig, SimEngineConfig
from stormguard_server.guards.admin_guard import ADMIN_TOKEN_ENV, check_token
from stormguard_server.guards.priority_trust import PRIORITY_TOKEN_ENV, split_networks

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


def _priority_token(text: str) -> str:
    try:
        return check_token(text, what="a priority token")
    except ValueError as exc:  # its message never quotes the token
        raise argparse.ArgumentTypeError(str(exc)) from None


def _networks(text: str) -> list[str]:
    try:
        return split_networks(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class _Networks(argparse.Action):
    """Comma-separated networks; the flag may be repeated, and its first use replaces
    the default (so ``--trust-priority-from 10.0.0.0/8`` trusts no loopback)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        current = getattr(namespace, self.dest)
        kept = [] if current is self.default else list(current)
        setattr(namespace, self.dest, [*kept, *(values or [])])


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
        "--port-file",
        default=None,
        metavar="PATH",
        help='once listening, write the ports bound here as JSON ({"port": P, "admin_port": A '
        "or null}), replaced whole: with --port 0 and --admin-port 0, how a script learns them",
    )
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
        "--max-header-bytes",
        type=_positive_int,
        default=_SERVER.max_header_bytes,
        help="most bytes of a request's head (request line, headers, blank line); past it: "
        "431 and the connection closed",
    )
    http.add_argument(
        "--max-header-count",
        type=_positive_int,
        default=_SERVER.max_header_count,
        help="most header lines in a request; past it: 431 and the connection closed",
    )
    http.add_argument(
        "--trust-priority-from",
        type=_networks,
        action=_Networks,
        default=",".join(_SERVER.priority_trust.networks),
        metavar="CIDRS",
        help="networks (comma-separated CIDRs or addresses; repeatable; 'none' for none) "
        "whose callers may send x-priority: critical. From others it is served as standard "
        "(unless they send --priority-token); standard and sheddable are always kept",
    )
    http.add_argument(
        "--priority-token",
        type=_priority_token,
        default=None,
        metavar="TOKEN",
        help="a caller sending this in x-priority-token may send x-priority: critical from "
        f"any address; 16+ visible ASCII characters; ${PRIORITY_TOKEN_ENV} is better (argv "
        "shows in ps)",
    )
    http.add_argument(
        "--trust-forwarded-from",
        type=_networks,
        action=_Networks,
        default="none",
        metavar="CIDRS",
        help="proxies (comma-separated CIDRs or addresses; repeatable) whose X-Forwarded-For "
        "names the client; from any other peer the client is the peer's address",
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
        "logged once at start (event admin_token). A token starting with '-' is written "
        "--admin-token=TOKEN",
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
        help="a KV allocation that does not fit crashes the engine (the OOM avalanche); "
        "--no-oom preempts like vLLM instead",
    )
    engine.add_argument(
        "--prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=_ENGINE.prefix_caching,
        help="automatic prefix caching as vLLM V1's: a prompt's full KV blocks already "
        "cached (same leading tokens) are not prefilled again; freed blocks stay cached "
        "until evicted, least recently used first (on by default, as in vLLM V1)",
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
        "--hang-rate",
        type=_fraction,
        default=0.0,
        help="fraction of requests that hang without an answer until their deadline"
        " (x-stormguard-deadline-ms) or 600 s, unless the client leaves first",
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
    add_quota_flags(parser)
    return parser
