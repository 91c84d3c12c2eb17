"""Token counting throughput and the latency the pre-check adds to a call.

    .venv/bin/python bench/bench_tokens.py [--calls 2000]

Prints tokens/s for a 100k-token prompt per counter, then median and p99 of
``TokenPolicy`` pre-checks per call: offline (tiktoken + table) and through the
sync driver with a cached ``/v1/models`` answer (httpx.MockTransport, no sockets).
Not a timed test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import httpx

from stormguard.tokens import (
    EstimatingCounter,
    TiktokenCounter,
    TokenCounter,
    TokenPolicy,
    run_precheck_sync,
)

VOCABULARY = (
    "the of and to in is for on that with as by at from this be are it or an was which not "
    "server request token cache queue retry budget breaker deadline window prompt model "
    "latency throughput admission overload restart allocation kernel batch stream"
)
WORDS = VOCABULARY.split()
EXTRAS = ["def f(x):\n    return x ** 2\n", "负载均衡器", "🚀", "{'k': [1, 2, 3]}", "\n\n"]


def make_prompt(target_tokens: int, counter: TokenCounter, seed: int = 0) -> str:
    """Varied text (prose, code, CJK, emoji) of about ``target_tokens`` o200k tokens."""
    rng = random.Random(seed)
    parts: list[str] = []
    while True:
        chunk = " ".join(rng.choice(WORDS) for _ in range(2000))
        parts.append(chunk + rng.choice(EXTRAS))
        text = "".join(parts)
        if counter.count_text(text) >= target_tokens:
            return text


def throughput(counter: TokenCounter, text: str, tokens: int, repeats: int) -> float:
    counter.count_text(text)  # warm up (loads the BPE file once)
    start = time.perf_counter()
    for _ in range(repeats):
        counter.count_text(text)
    return tokens * repeats / (time.perf_counter() - start)


def latency(call: Callable[[], object], calls: int) -> tuple[float, float]:
    call()
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    samples.sort()
    return statistics.median(samples), samples[int(0.99 * (len(samples) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    o200k = TiktokenCounter("o200k_base")
    prompt = make_prompt(100_000, o200k)
    tokens = o200k.count_text(prompt)
    print(f"prompt: {len(prompt):,} characters, {tokens:,} o200k tokens\n")
    print(f"{'counter':<24} {'tokens/s':>14} {'ms per 100k-token prompt':>26}")
    for counter in (o200k, TiktokenCounter("cl100k_base"), EstimatingCounter()):
        rate = throughput(counter, prompt, tokens, args.repeats)
        print(f"{counter.name:<24} {rate:>14,.0f} {tokens / rate * 1000:>26.2f}")

    short = {"messages": [{"role": "user", "content": prompt[:800]}], "max_tokens": 256}
    long = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 256}
    policy = TokenPolicy()
    models = httpx.Response(200, json={"data": [{"id": "gpt-4o", "max_model_len": 128_000}]})
    client = httpx.Client(transport=httpx.MockTransport(lambda request: models))
    base = "http://bench.invalid/v1"

    def via_driver(body: dict[str, object]) -> Callable[[], object]:
        return lambda: run_precheck_sync(
            policy.precheck_flow("gpt-4o", "chat", body, base_url=base), client
        )

    cases: list[tuple[str, Callable[[], object], int]] = [
        ("offline, ~200-token chat", lambda: policy.precheck("gpt-4o", "chat", short), args.calls),
        ("driver, ~200-token chat", via_driver(short), args.calls),
        ("offline, 100k-token chat", lambda: policy.precheck("gpt-4o", "chat", long), 50),
    ]
    print(f"\n{'pre-check per call':<28} {'median':>12} {'p99':>12} {'calls':>7}")
    for label, call, calls in cases:
        median, p99 = latency(call, calls)
        print(f"{label:<28} {median * 1e6:>10.1f}us {p99 * 1e6:>10.1f}us {calls:>7}")
    client.close()


if __name__ == "__main__":
    main()
