"""examples/prefix_affinity.py runs, against the three reference servers it starts
itself: with a derived key each conversation's turns stay on one replica; without
affinity they go by load; a tenant's ``prompt_cache_key`` keeps its calls on one
replica; a stopped replica moves only the conversations it was home to."""

from __future__ import annotations

import re

import pytest

from tests.e2e.test_examples import run

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # starts three servers: ~6 s


def lines(out: str, part: int) -> dict[str, list[str]]:
    found = re.findall(rf"^{part}\. (\w[\w ]*): ((?:replica-\w ?)+)$", out, re.MULTILINE)
    return {name: served.split() for name, served in found}


def test_prefix_affinity_example() -> None:
    out = run("prefix_affinity.py")
    kept = lines(out, 1)
    assert len(kept) == 6, out
    assert all(len(served) == 4 and len(set(served)) == 1 for served in kept.values()), out
    assert len({served[0] for served in kept.values()}) >= 2, out  # spread over replicas
    assert "1. affinity hits 24, overflows 0" in out
    by_load = lines(out, 2)
    assert len(by_load) == 6 and any(len(set(s)) > 1 for s in by_load.values()), out
    tenants = lines(out, 3)
    assert len(tenants) == 3 and all(len(set(s)) == 1 for s in tenants.values()), out
    [gone] = re.findall(r"^4\. (replica-\w) stopped$", out, re.MULTILINE)
    after = re.findall(
        r"^4\. (\w+): was (replica-\w), now (replica-\w) (replica-\w) \((\w+)\)$", out, re.MULTILINE
    )
    assert len(after) == 6, out
    for person, was, first, second, moved in after:
        assert was == kept[person][0]
        assert first == second != gone  # the next replica, and it stays there
        assert moved == ("moved" if was == gone else "stayed"), out
