"""Import time: ``import stormguard`` against ``import httpx`` (and ``import openai``).

    .venv/bin/python bench/bench_import.py [--runs 10] [--check] [--no-openai]

Each run imports one module in a fresh interpreter, which times only the import
(interpreter start-up is left out: it is the same for all). Runs are interleaved
(httpx, stormguard, openai, httpx, ...) so drift on a shared machine hits all alike.
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

# Time the import inside the child, so start-up and shut-down are not counted.
_PROBE = "import time; t0 = time.perf_counter(); import {module}; print(time.perf_counter() - t0)"


def import_ms(module: str, env: dict[str, str]) -> float:
    """Milliseconds that ``import module`` takes in a fresh interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(module=module)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout
    return float(out.strip().splitlines()[-1]) * 1000.0


def measure(modules: list[str], runs: int) -> dict[str, list[float]]:
    """``runs`` timings per module, interleaved, after one untimed warm-up round."""
    with tempfile.TemporaryDirectory(prefix="bench-import-pycache-") as cache:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = cache
        for module in modules:
            import_ms(module, env)
        times: dict[str, list[float]] = {module: [] for module in modules}
        for _ in range(runs):
            for module in modules:
                times[module].append(import_ms(module, env))
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

    modules = ["httpx", "stormguard"] + ([] if args.no_openai else ["openai"])
    times = measure(modules, args.runs)
    medians = {module: statistics.median(values) for module, values in times.items()}
    print(f"{'module':<12} {'median ms':>10} {'q1-q3 ms':>10} {'min':>6} {'max':>6}")
    for module, values in times.items():
        print(
            f"{module:<12} {medians[module]:>10.1f} {spread(values):>10}"
            f" {min(values):>6.0f} {max(values):>6.0f}"
        )
    extra = medians["stormguard"] - medians["httpx"]
    ratio = medians["stormguard"] / medians["httpx"]
    print(
        f"stormguard - httpx: {extra:+.1f} ms (target <= {MAX_EXTRA_MS:.0f}); "
        f"ratio {ratio:.2f}x (target <= {MAX_RATIO}x); runs {args.runs}"
    )
    over = extra > MAX_EXTRA_MS or ratio > MAX_RATIO
    if over:
        print("over target")
    return 1 if args.check and over else 0


if __name__ == "__main__":
    sys.exit(main())
