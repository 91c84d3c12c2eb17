"""Old public names keep working for a while: each warns and names its successor."""

from __future__ import annotations

import pytest

import stormguard

RENAMED = {
    "BreakerState": "BreakerSnapshot",
    "BudgetState": "BudgetSnapshot",
    "DiscoveryState": "DiscoverySnapshot",
    "LimitState": "LimitSnapshot",
}


@pytest.mark.parametrize(("old", "new"), sorted(RENAMED.items()))
def test_an_old_snapshot_name_warns_and_is_the_new_class(old: str, new: str) -> None:
    with pytest.warns(DeprecationWarning, match=f"stormguard.{new}"):
        value = getattr(stormguard, old)
    assert value is getattr(stormguard, new)
    assert old not in stormguard.__all__ and new in stormguard.__all__


def test_every_use_of_an_old_name_warns_not_only_the_first() -> None:
    for _ in range(2):
        with pytest.warns(DeprecationWarning, match="BudgetSnapshot"):
            from stormguard import BudgetState  # noqa: F401


def test_state_returns_a_snapshot() -> None:
    assert type(stormguard.RetryBudget().state()) is stormguard.BudgetSnapshot
