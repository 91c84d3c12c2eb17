"""A batch job of several processes on one API key with a per-minute token quota.

    .venv/bin/python examples/quota_batch.py                  # 6 processes x 8 threads, 300 calls
    .venv/bin/python examples/quota_batch.py --no-quota       # the same without quota pacing
    .venv/bin/python examples/quota_batch.py --processes 3 --calls 60 --tpm 6000 --max-tokens 100
    .venv/bin/python examples/quota_batch.py --no-headers --processes 16  # no x-ratelimit-*
    .venv/bin/python examples/quota_batch.py --no-headers --processes 16 --alone
    .venv/bin/python examples/quota_batch.py --no-headers --processes 16 \
        --redis redis://127.0.0.1:6379/0                      # the key's bucket shared in Redis

It starts ``stormguard-server`` on a free loopback port with a hosted API's quota
on every API key (``--quota-tpm``, answers of ~0.5 s), then runs the batch: each
process is a ``stormguard.Client`` on the same key, its threads calling
``chat.completions.create`` until the batch is done. stormguard learns the key's
rate from the ``x-ratelimit-*`` headers and each process's share of it, and paces
its calls to it (docs/quotas.md). The processes share the key's bucket through files
on this machine (``QuotaPolicy.share_on_host``, the default; ``--alone``: each paces
alone, as on many hosts), or with ``--redis URL`` in that Redis
(``QuotaPolicy(redis_url=...)``). At the end it prints the calls
that succeeded, the requests sent, the quota 429s the server answered, the wall time
against the least the quota allows, and each process's share of the key.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import re
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

import stormguard

MODEL = "stormguard-sim"
KEY = "sk-example-batch-key"
MESSAGES = [{"role": "user", "content": "Summarize the quarterly report in one line."}]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def reference_server(args: argparse.Namespace) -> Iterator[str]:
    """Run stormguard-server with the quota; yield its root URL once /ready says yes."""
    port = free_port()
    flags = [
        "--quota-tpm", str(args.tpm),
        "--quota-retry-after", args.retry_after,
        *([] if args.headers else ["--no-quota-headers"]),
        # ~0.5 s answers, whatever their length; room for every call at once.
        "--added-latency-ms", "500", "--step-base-ms", "0",
        "--prefill-token-us", "0", "--decode-seq-us", "0",
        "--num-kv-blocks", "8192", "--max-num-seqs", "256",
        "--log-level", "warning",
    ]  # fmt: skip
    print(f"$ stormguard-server --port {port} {' '.join(flags)}")
    command = [sys.executable, "-m", "stormguard_server", "--port", str(port), *flags]
    process = subprocess.Popen(command)
    root = f"http://127.0.0.1:{port}"
    try:
        started = time.monotonic()
        while True:
            if process.poll() is not None:
                raise SystemExit(f"the server exited with {process.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{root}/ready", timeout=1).status_code == 200:
                    break
            if time.monotonic() - started > 30:
                raise SystemExit("the server did not become ready in 30 s")
            time.sleep(0.1)
        yield root
    finally:
        process.terminate()
        process.wait(timeout=10)


def run_process(
    root: str,
    calls: int,
    threads: int,
    max_tokens: int,
    quota: bool,
    start_at: float,
    redis: str | None = None,
    alone: bool = False,
) -> dict[str, Any]:
    """One process of the batch: ``calls`` calls on ``threads`` threads."""
    client = stormguard.Client(
        base_url=f"{root}/v1",
        api_key=KEY,
        model=MODEL,
        timeout=120.0,
        quota=stormguard.QuotaPolicy(redis_url=redis, share_on_host=not alone) if quota else None,
    )
    outcomes: Counter[str] = Counter()

    def one(_: int) -> None:
        try:
            client.chat.completions.create(messages=MESSAGES, max_tokens=max_tokens)
            outcomes["ok"] += 1
        except stormguard.StormguardError as exc:
            outcomes[type(exc).__name__] += 1

    time.sleep(max(0.0, start_at - time.time()))  # every process starts together
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(calls)))
    stats = client.stats()
    client.close()
    snapshot = stats.quota[0] if stats.quota else None
    return {
        "outcomes": dict(outcomes),
        "attempts": stats.attempts,
        "paced_429s": stats.paced_429s,
        "share": None if snapshot is None else snapshot.share_tokens,
        "waits": 0 if snapshot is None else snapshot.waits,
        "wait_s": 0.0 if snapshot is None else snapshot.wait_s,
        "backend": None if snapshot is None else snapshot.backend,
    }


def server_counts(root: str) -> tuple[float, float, float]:
    """Requests the key's quota admitted, tokens it charged, and its 429s."""
    text = httpx.get(f"{root}/metrics").text

    def total(name: str) -> float:
        pattern = rf"^stormguard_{name}_total\{{[^}}]*\}} ([0-9.e+]+)$"
        return sum(float(v) for v in re.findall(pattern, text, re.M))

    return total("quota_admitted"), total("quota_tokens_charged"), total("quota_refused")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=6)
    parser.add_argument("--threads", type=int, default=8, help="threads per process")
    parser.add_argument("--calls", type=int, default=300, help="calls in the whole batch")
    parser.add_argument("--tpm", type=int, default=60_000, help="the key's tokens per minute")
    parser.add_argument("--max-tokens", type=int, default=300)
    parser.add_argument("--no-quota", dest="quota", action="store_false", help="quota=None")
    parser.add_argument("--no-headers", dest="headers", action="store_false",
                        help="the server sends no x-ratelimit-* headers (429s only)")  # fmt: skip
    parser.add_argument("--retry-after", default="seconds", choices=["none", "seconds", "ms"])
    parser.add_argument("--redis", metavar="URL", help="share the key's bucket in this Redis")
    parser.add_argument(
        "--alone",
        action="store_true",
        help="each process paces alone (share_on_host=False), as on many hosts without Redis",
    )
    args = parser.parse_args()
    with reference_server(args) as root:
        per = [args.calls // args.processes] * args.processes
        for i in range(args.calls % args.processes):
            per[i] += 1
        start_at = time.time() + 2.0  # time for every process to import and start
        jobs = [
            (root, n, args.threads, args.max_tokens, args.quota, start_at, args.redis, args.alone)
            for n in per
            if n
        ]
        with multiprocessing.get_context("spawn").Pool(len(jobs)) as pool:
            results = pool.starmap(run_process, jobs)
        wall = time.time() - start_at
        admitted, charged, refused = server_counts(root)
    outcomes: Counter[str] = Counter()
    for result in results:
        outcomes.update(result["outcomes"])
    attempts = sum(r["attempts"] for r in results)
    ok = outcomes.pop("ok", 0)
    cost = charged / admitted if admitted else 0.0
    ideal = max(0.0, (args.calls * cost - args.tpm) / (args.tpm / 60)) + 0.5
    shared = ", each process alone" if args.alone else ", shared in this machine's files"
    if args.redis:
        shared = f", shared in Redis at {args.redis}"
    print(f"\nquota pacing: {'on' + shared if args.quota else 'off (quota=None)'}")
    print(f"calls: {ok} of {args.calls} succeeded; failed: {dict(outcomes) or 0}")
    print(f"requests: {attempts} sent, {attempts / args.calls:.2f} per call")
    print(f"quota 429s: {refused:.0f} (the server's count)")
    print(f"wall time: {wall:.1f} s; the least the quota allows: {ideal:.1f} s")
    for i, result in enumerate(results):
        share = "-" if result["share"] is None else f"{result['share']:.2f}"
        print(
            f"  process {i}: share of the key {share}, {result['waits']} waits"
            f" ({result['wait_s']:.1f} s in all), {result['paced_429s']} paced 429s,"
            f" paced by {result['backend'] or '-'}"
        )


if __name__ == "__main__":
    main()
