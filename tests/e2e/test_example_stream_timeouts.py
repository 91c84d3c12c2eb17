"""examples/stream_timeouts.py runs, against the two reference servers it starts itself."""

from __future__ import annotations

import re

import pytest

from tests.e2e.test_examples import run

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_stream_timeouts_example() -> None:
    out = run("stream_timeouts.py")
    assert "1. timeout=1, no StreamTimeouts: cut after" in out
    assert "The call's deadline passed" in out or "the call's deadline passed" in out
    assert "2. timeout=1, idle=0.5: all 80 chunks" in out
    calls = re.findall(r"^3\. call \d: (.*), \d+ characters in ([\d.]+) s$", out, re.MULTILINE)
    assert len(calls) == 3, out
    for path, _took in calls:
        # An attempt to the slow server gives up at its first-chunk bound and the call
        # ends on the fast one (how long it took is printed, not held to a bound here:
        # the machine's speed is the benchmarks' business).
        assert path.endswith("fast (ok)"), out
        assert "slow (ok)" not in path
