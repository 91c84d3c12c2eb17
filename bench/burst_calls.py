"""What the burst scripts share (bench_burst.py, bench_outage.py, bench_partial.py):
the chat call each sync client makes (stormguard's, openai-python's as it comes and
inside a tenacity retry), the tally of what the application saw, a batch of calls
from threads released at once, the p99 of latencies and a server's count once it
stops moving. The model is the drill's (``stormguard_drill.clients.drill_client``);
the scripts that run LiteLLM import it the drill's way
(``stormguard_drill.clients.litellm_client``), not through this module.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import openai
import tenacity

import stormguard
from stormguard_drill.clients.drill_client import MODEL

PROMPT = "say something about queues"
MESSAGES = [{"role": "user", "content": PROMPT}]

Call = Callable[[], int]  # one chat call; returns its completion tokens, raises on failure


@dataclass
class Tally:
    """What the application saw of each call, from any number of threads."""

    latencies: list[float] = field(default_factory=list)
    tokens: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ok(self, latency_s: float, tokens: int) -> None:
        with self.lock:
            self.latencies.append(latency_s)
            self.tokens += tokens

    def failed(self, exc: BaseException) -> None:
        self.failed_as(type(exc).__name__)

    def failed_as(self, error: str) -> None:
        """A failure by its name: its exception's class name, as the drill's clients
        report theirs (``CallOutcome.error``)."""
        with self.lock:
            self.errors[error] = self.errors.get(error, 0) + 1


def stormguard_call(base_url: str, deadline: float, max_tokens: int, **options: Any) -> Call:
    client = stormguard.Client(base_url=base_url, model=MODEL, timeout=deadline, **options)

    def call() -> int:
        resp = client.chat.completions.create(messages=MESSAGES, max_tokens=max_tokens)
        return int(resp.usage.completion_tokens) if resp.usage is not None else 0

    return call


def openai_call(client: openai.OpenAI, max_tokens: int) -> Call:
    def call() -> int:
        resp = client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=max_tokens,
        )
        return resp.usage.completion_tokens if resp.usage else 0

    return call


def openai_default(base_url: str, deadline: float, max_tokens: int) -> Call:
    return openai_call(
        openai.OpenAI(base_url=base_url, api_key="bench", timeout=deadline), max_tokens
    )


def openai_tenacity(base_url: str, deadline: float, max_tokens: int) -> Call:
    client = openai.OpenAI(base_url=base_url, api_key="bench", timeout=deadline, max_retries=0)
    retrying = tenacity.retry(
        stop=tenacity.stop_after_attempt(3) | tenacity.stop_after_delay(deadline),
        wait=tenacity.wait_random_exponential(multiplier=1, max=8),
        reraise=True,
    )
    return retrying(openai_call(client, max_tokens))


def run_threads(call: Call, calls: int, threads: int, tally: Tally) -> float:
    """``calls`` calls from ``threads`` threads, all released at once; the wall time."""
    start = threading.Event()

    def one() -> None:
        start.wait()
        began = time.monotonic()
        try:
            got = call()
        except Exception as exc:  # the figure is what the application saw
            tally.failed(exc)
            return
        tally.ok(time.monotonic() - began, got)

    with ThreadPoolExecutor(max_workers=threads) as pool:
        futures = [pool.submit(one) for _ in range(calls)]
        began = time.monotonic()
        start.set()
        for future in futures:
            future.result()
    return time.monotonic() - began


def p99(latencies: list[float]) -> float | None:
    """Inclusive: the default (exclusive) method extrapolates past the slowest call
    when there are fewer than 100, so a p99 could exceed the burst's wall time."""
    if len(latencies) < 2:
        return None
    return statistics.quantiles(latencies, n=100, method="inclusive")[98]


def settled(read: Callable[[], int]) -> int:
    """A server-side count once it stops moving: vLLM counts a finished request just
    after answering it, and its log reaches the file a little later still."""
    value = read()
    for _ in range(15):
        time.sleep(0.2)
        again = read()
        if again == value:
            return value
        value = again
    return value
