"""Import time: ``import stormguard`` against ``import httpx`` (and ``import openai``).

    .venv/bin/python bench/bench_import.py [--runs 10] [--check] [--no-openai]

Each run times one import statement in a fresh interpreter (interpreter start-up
is left out: it is the same for all). Runs are interleaved (httpx, stormguard,
stormguard's client, openai, httpx, ...) so drift on a shared machine hits all
alike. ``import stormguard`` loads each public name on first use, so the client's
own line, ``from stormguard import Client``, is what a program pays before its
first call (it imports httpx too).
One untimed warm-up round first writes the bytecode caches, into a temporary
``PYTHONPYCACHEPREFIX`` with bytecode writing on whatever the environment says, so
that every module loads from its cache as in an installed package, never compiled.

Targets: stormguard at most 20 ms over httpx and at most 1.2x httpx, medians
compared. ``--check`` exits 1 when either is missed. Not a timed test: numbers
depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

MAX_EXTRA_MS = 20.0
MAX_RATIO = 1.2

#: What each row times.
STATEMENTS = {
    "httpx": "import httpx",
    "stormguard": "import stormguard",
    "stormguard.Client": "from stormguard import Client",
    "openai": "import openai",
}

# Time the import inside the child, so start-up and shut-down are not counted.
_PROBE = "import time; t0 = time.perf_counter(); {statement}; print(time.perf_counter() - t0)"


def import_ms(name: str, env: dict[str, str]) -> float:
    """Milliseconds that row ``name``'s statement takes in a fresh interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(statement=STATEMENTS[name])],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout
    return float(out.strip().splitlines()[-1]) * 1000.0


def measure(names: list[str], runs: int) -> dict[str, list[float]]:
    """``runs`` timings per row, interleaved, after one untimed warm-up round."""
    with tempfile.TemporaryDirectory(prefix="bench-import-pycache-") as cache:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = cache
        for name in names:
            import_ms(name, env)
        times: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(runs):
            for name in names:
                times[name].append(import_ms(name, env))
    return times


def spread(values: list[float]) -> str:
    """Quartiles as ``q1-q3``: the middle half of the runs."""
    if len(values) < 2:
        return "-"
    q1, _, q3 = statistics.quantiles(values, n=4)
    return f"{q1:.0f}-{q3:.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="fresh processes per module")
    parser.add_argument("--check", action="store_true", help="exit 1 when over target")
    parser.add_argument("--no-openai", action="store_true", help="leave openai out")
    args = parser.parse_args(argv)

    names = ["httpx", "stormguard", "stormguard.Client"] + ([] if args.no_openai else ["openai"])
    times = measure(names, args.runs)
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(f"{'statement':<32} {'median ms':>10} {'q1-q3 ms':>10} {'min':>6} {'max':>6}")
    for name, values in times.items():
        print(
            f"{STATEMENTS[name]:<32} {medians[name]:>10.1f} {spread(values):>10}"
            f" {min(values):>6.0f} {max(values):>6.0f}"
        )
    base = medians["httpx"]
    for name in ("stormguard", "stormguard.Client"):
        print(
            f"{STATEMENTS[name]} - import httpx: {medians[name] - base:+.1f} ms,"
            f" {medians[name] / base:.2f}x"
        )
    extra = medians["stormguard"] - base
    ratio = medians["stormguard"] / base
    print(
        f"target (import stormguard): <= +{MAX_EXTRA_MS:.0f} ms and <= {MAX_RATIO}x;"
        f" runs {args.runs} per statement"
    )
    over = extra > MAX_EXTRA_MS or ratio > MAX_RATIO
    if over:
        print("over target")
    return 1 if args.check and over else 0


if __name__ == "__main__":
    sys.exit(main())
