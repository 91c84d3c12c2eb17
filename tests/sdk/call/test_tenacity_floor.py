"""The retry loop at the oldest tenacity stormguard allows (8.3.0, the first to compute
the wait before asking stop, which the deadline check reads): the tests of the retry
loop, failover and the retry policy run again in a child process that imports it.
``make setup`` installs it beside the newest, in .venv/tenacity-floor."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
FLOOR = Path(sys.prefix) / "tenacity-floor"
FLOOR_VERSION = "8.3.0"
SUITES = [
    "tests/sdk/call/test_pipeline.py",  # the retry loop, its waits and its deadline
    "tests/sdk/policies/routing/test_failover.py",
    "tests/sdk/policies/retry/test_retry_policy.py",
]


def test_the_retry_loop_at_the_oldest_tenacity_allowed() -> None:
    if not (FLOOR / "tenacity").is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"{FLOOR} is missing: make setup installs tenacity {FLOOR_VERSION} there")
        pytest.skip(f"no tenacity {FLOOR_VERSION} in {FLOOR} (make setup installs it)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FLOOR), *sys.path])}
    probe = subprocess.run(
        [sys.executable, "-c", "import importlib.metadata as m; print(m.version('tenacity'))"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert probe.stdout.strip() == FLOOR_VERSION
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SUITES],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-2000:]
