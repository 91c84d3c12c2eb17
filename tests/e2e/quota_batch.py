"""A batch job on one key against the reference server's hosted-API quota without
headers (429s only, whole-second Retry-After), for the end-to-end tests of pacing
to it: one process alone on its key (``tests/e2e/test_quota_no_headers.py``) or the
key's bucket shared in Redis (``tests/e2e/test_quota_redis.py``). The server runs
0.1 s answers whatever their length, with room for every call at once: the time
is the quota's, not the simulated engine's."""

from __future__ import annotations

import multiprocessing
import re
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import stormguard
from stormguard_server.quota.buckets import key_label
from tests.e2e.server_process import RunningServer, run_server

MODEL = "stormguard-sim"
MESSAGES = [{"role": "user", "content": "Summarize the report."}]
#: 12,000 tokens a minute (200 a second); each call is charged 215 (its 15 prompt
#: tokens and 200 max_tokens): a full bucket holds 55 calls, then ~1 a second.
TPM = 12_000
MAX_TOKENS = 200
PROCESSES = 3
THREADS = 4
CALLS = 22  # per process: 66 in all, 11 past the bucket


@contextmanager
def quota_server() -> Iterator[RunningServer]:
    """A server whose keys each have TPM tokens a minute, told by 429s alone."""
    with run_server(
        "--quota-tpm",
        str(TPM),
        "--no-quota-headers",
        "--quota-retry-after",
        "seconds",
        "--added-latency-ms",
        "100",
        "--step-base-ms",
        "0",
        "--prefill-token-us",
        "0",
        "--decode-seq-us",
        "0",
        "--num-kv-blocks",
        "8192",
        "--max-num-seqs",
        "256",
    ) as server:
        yield server


def server_counts(server: RunningServer, key: str) -> tuple[float, float, float]:
    """Requests ``key``'s quota admitted, its 429s, and the tokens it charged."""
    samples = server.metrics()
    label = re.escape(f'key="{key_label({"authorization": f"Bearer {key}"})}"')

    def total(name: str) -> float:
        return sum(
            v for k, v in samples.items() if re.match(rf"stormguard_{name}_total\{{.*{label}", k)
        )

    return total("quota_admitted"), total("quota_refused"), total("quota_tokens_charged")


_start: Any = None


def meet_at(barrier: Any) -> None:
    """A pool's initializer: the barrier every worker waits at before its batch."""
    global _start
    _start = barrier


def worker(
    base_url: str, quota: stormguard.QuotaPolicy, key: str, calls: int, threads: int
) -> dict[str, Any]:
    """One process of the batch (spawned): ``calls`` chat calls on ``threads`` threads,
    begun when every process is ready (the pool's barrier)."""
    client = stormguard.Client(
        base_url=base_url, api_key=key, model=MODEL, timeout=90.0, quota=quota
    )

    def one(_: int) -> tuple[str, list[tuple[str, str | None]]]:
        """The call's outcome, and its attempts neither paced nor ok."""
        try:
            result = client.chat.completions.create(messages=MESSAGES, max_tokens=MAX_TOKENS)
        except stormguard.StormguardError as exc:
            return type(exc).__name__, []
        odd = [(a.outcome, a.error_type) for a in result.attempt_history]
        return "ok", [o for o in odd if o[0] not in ("ok", "paced")]

    _start.wait(timeout=60)  # every process starts at once, however slow its start-up
    began = time.time()
    # Each call's outcome is returned, not counted from the threads: ``Counter``'s
    # ``+=`` is no atomic update, and under load it lost calls.
    with ThreadPoolExecutor(threads) as pool:
        done = list(pool.map(one, range(calls)))
    ended = time.time()
    outcomes = Counter(outcome for outcome, _ in done)
    others = [o for _, odd in done for o in odd]
    stats = client.stats()
    client.close()
    return {
        "outcomes": dict(outcomes),
        "attempts": stats.attempts,
        "paced_429s": stats.paced_429s,
        "others": others,
        "backends": [q.backend for q in stats.quota],
        "modes": [q.mode for q in stats.quota],
        "shares": [q.share_tokens for q in stats.quota],
        "began": began,
        "ended": ended,
    }


def ideal_s(calls: int, charge: float) -> float:
    """The least time the key allows ``calls`` of ``charge``: a full bucket at once,
    then its refill."""
    return max(0.0, (calls * charge - TPM) / (TPM / 60))


@dataclass(frozen=True)
class Batch:
    """A batch's processes' results and the server's counts of its key."""

    results: list[dict[str, Any]]
    admitted: float
    refused: float
    charged: float

    @property
    def calls(self) -> int:
        return PROCESSES * CALLS

    @property
    def attempts(self) -> int:
        return int(sum(r["attempts"] for r in self.results))

    @property
    def wall(self) -> float:
        return max(r["ended"] for r in self.results) - min(r["began"] for r in self.results)

    def check_every_call_paced(self) -> None:
        """Every call succeeded, every 429 went back to the pacer (none spent a retry);
        an attempt of another outcome (a connection error, say) is not the quota's: it
        is counted, and shown."""
        others = [o for r in self.results for o in r["others"]]
        assert sum(r["outcomes"].get("ok", 0) for r in self.results) == self.calls, self.results
        paced = sum(r["paced_429s"] for r in self.results)
        assert self.admitted == self.calls and paced == self.refused, self.results
        assert self.attempts == self.calls + self.refused + len(others), others


def run_batch(server: RunningServer, policy: stormguard.QuotaPolicy, key: str) -> Batch:
    """``PROCESSES`` spawned processes on ``key``, started together, ``worker`` each."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(PROCESSES)
    jobs = [(server.base_url, policy, key, CALLS, THREADS)] * PROCESSES
    with context.Pool(PROCESSES, initializer=meet_at, initargs=(barrier,)) as pool:
        results = pool.starmap(worker, jobs)
    return Batch(results, *server_counts(server, key))
