"""RetryBudget alone: ratio, floor, the sliding window, threads."""

from __future__ import annotations

import threading

import pytest

from stormguard import RetryBudget
from stormguard.testing import FakeClock


def spend_all(budget: RetryBudget) -> int:
    spent = 0
    while budget.try_spend():
        spent += 1
        assert spent < 10_000
    return spent


def test_ratio_of_calls_in_the_window() -> None:
    budget = RetryBudget(ratio=0.1, min_retries_per_second=0, clock=FakeClock())
    for _ in range(100):
        budget.record_call()
    assert spend_all(budget) == 10
    state = budget.state()
    assert (state.calls, state.retries, state.refused) == (100, 10, 1)
    assert state.available < 1


def test_floor_lets_a_rare_caller_retry() -> None:
    budget = RetryBudget(ratio=0.1, window=10, min_retries_per_second=0.2, clock=FakeClock())
    budget.record_call()
    assert spend_all(budget) == 2  # 0.1 * 1 + 0.2 * 10 = 2.1


def test_deposits_and_withdrawals_expire_with_the_window() -> None:
    clock = FakeClock()
    budget = RetryBudget(ratio=0.5, window=10, min_retries_per_second=0, clock=clock)
    for _ in range(10):
        budget.record_call()
    assert spend_all(budget) == 5
    clock.advance(5)
    assert not budget.try_spend()  # still the same window
    clock.advance(5.5)
    assert budget.state().calls == 0
    assert not budget.try_spend()  # old calls no longer pay for retries
    for _ in range(4):
        budget.record_call()
    assert spend_all(budget) == 2  # old retries no longer count either


def test_sliding_not_tumbling() -> None:
    clock = FakeClock()
    budget = RetryBudget(ratio=1.0, window=10, buckets=10, min_retries_per_second=0, clock=clock)
    for _ in range(10):
        budget.record_call()
        clock.advance(1)
    # At t=10 the call from t=0 has left the window, the other nine remain.
    assert budget.state().calls == 9


def test_threads_never_overspend() -> None:
    budget = RetryBudget(ratio=0.1, min_retries_per_second=0, clock=FakeClock())
    for _ in range(1000):
        budget.record_call()
    granted = []

    def worker() -> None:
        granted.append(sum(budget.try_spend() for _ in range(100)))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(granted) == 100


@pytest.mark.parametrize(
    "kwargs",
    [{"ratio": -0.1}, {"window": 0}, {"min_retries_per_second": float("nan")}, {"buckets": 0}],
)
def test_invalid_budgets(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryBudget(**kwargs)  # type: ignore[arg-type]
