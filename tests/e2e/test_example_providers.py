"""examples/providers_failover.py runs, against the two reference servers it starts
itself: calls succeed on the secondary while the primary is degraded, and come back
to the primary, gradually, once it recovers."""

from __future__ import annotations

import re

import pytest

from tests.e2e.test_examples import run

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_providers_failover_example() -> None:
    out = run("providers_failover.py")
    healthy = re.findall(r"^1\. call \d: (.*)$", out, re.MULTILINE)
    assert healthy == ["primary (ok); answered by model gpt-4.1"] * 3, out

    degraded = re.findall(r"^2\. call \d: (.*)$", out, re.MULTILINE)
    assert len(degraded) == 8, out
    for path in degraded:
        # Every call succeeds, on the secondary, under its own name for the model.
        assert path.endswith("secondary (ok); answered by model prod-gpt41"), out
        assert "primary (ok)" not in path
    # Five failures in a row took the primary out: the calls after went straight on.
    assert sum(path.startswith("secondary") for path in degraded) >= 1, out
    assert "tier 1 left for model chat-large: primary ejected (consecutive_failures)" in out
    assert "2. tiers left: (('chat-large', 1),)" in out

    rounds = [
        (int(primary), int(secondary))
        for primary, secondary in re.findall(
            r"^3\. round \d+ at [\d.]+ s: primary (\d), secondary (\d)$", out, re.MULTILINE
        )
    ]
    assert rounds, out
    # Back gradually: one stream at first (its limit starts from its floor), all at last.
    assert rounds[0] == (1, 5), out
    assert rounds[-1] == (6, 0), out
    assert [p for p, _ in rounds] == sorted(p for p, _ in rounds), out
    assert "tier 1 back in rotation for model chat-large" in out
    assert "3. tiers left: ()" in out
