"""examples/hedged_stream.py runs, against the two reference servers it starts
itself (one holding each request 5 s): without hedging the streams on the slow
replica wait 5 s for their first chunk; with it, each of those is hedged to the
fast replica, which answers it, and the slow replica sees the client leave."""

from __future__ import annotations

import re

import pytest

from tests.e2e.test_examples import run

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # two servers and a 5 s wait: ~8 s


def test_hedged_stream_example() -> None:
    out = run("hedged_stream.py")
    plain = re.findall(
        r"^1\. stream \d: first chunk after ([\d.]+) s from (replica-\w+)$", out, re.M
    )
    assert len(plain) == 6, out
    slow_ones = sum(replica == "replica-slow" for _, replica in plain)
    assert slow_ones >= 1, out  # spread by load over both
    assert all(float(t) >= 4.5 for t, r in plain if r == "replica-slow"), out
    hedged = re.findall(
        r"^2\. stream \d: first chunk after ([\d.]+) s from (replica-\w+)( \(hedged\))?$", out, re.M
    )
    assert len(hedged) == 6, out
    assert all(replica == "replica-fast" for _, replica, _ in hedged), out
    assert all(float(t) < 4.5 for t, _, _ in hedged), out  # none waited for the slow one
    sent = sum(bool(mark) for _, _, mark in hedged)
    assert sent >= 1 and f"2. hedges sent {sent}, won {sent}" in out, out
    [left] = re.findall(r"^2\. the slow replica saw (\d+) clients leave", out, re.M)
    assert int(left) == sent, out
