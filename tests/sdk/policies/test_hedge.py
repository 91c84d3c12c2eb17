"""The hedge policy's parts alone: the delay tracker (quantile, window, bounded
models), the budget, and the endpoint a hedge may go to."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stormguard
from stormguard import HedgePolicy
from stormguard._call.endpoint_choice import hedge_target
from stormguard._call.pipeline import LogicalCall
from stormguard._call.spec_builder import CallExtras
from stormguard._policies.hedge.state import MAX_MODELS, HedgeState, LatencyWindow
from stormguard.testing import FakeClock
from tests.sdk.helpers import MESSAGES, unreachable


def test_no_delay_until_enough_latencies_then_the_quantile() -> None:
    state = HedgeState(FakeClock())
    policy = HedgePolicy(min_samples=20, window=100)
    for ms in range(1, 20):
        state.observe("m", ms / 1000, policy)
    assert state.delay_for("m", policy) is None
    state.observe("m", 0.020, policy)
    # Nearest rank: the 19th of 1..20 ms.
    assert state.delay_for("m", policy) == pytest.approx(0.019)
    assert state.delay_for("other", policy) is None
    assert state.delay_for("m", HedgePolicy(delay=0.5)) == 0.5


def test_the_window_keeps_the_newest_latencies_only() -> None:
    state = HedgeState(FakeClock())
    policy = HedgePolicy(min_samples=10, window=10, quantile=0.5)
    for _ in range(10):
        state.observe("m", 5.0, policy)
    for _ in range(10):
        state.observe("m", 0.1, policy)
    assert state.delay_for("m", policy) == 0.1  # the slow ones left the window


def test_the_models_kept_are_bounded() -> None:
    state = HedgeState(FakeClock())
    policy = HedgePolicy(min_samples=1)
    for n in range(MAX_MODELS + 10):
        state.observe(f"model-{n}", 0.1, policy)
    assert state.models() == MAX_MODELS
    assert state.delay_for("model-0", policy) is None  # the oldest went first
    assert state.delay_for(f"model-{MAX_MODELS + 9}", policy) == 0.1


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0, 100), min_size=1, max_size=50), st.floats(0.01, 1.0))
def test_the_quantile_is_one_of_the_latencies_with_enough_below(
    latencies: list[float], q: float
) -> None:
    window = LatencyWindow(100)
    for value in latencies:
        window.add(value, 100)
    chosen = window.quantile(q)
    assert chosen in latencies
    assert sum(v <= chosen for v in latencies) >= q * len(latencies) - 1e-9


def test_the_budget_is_a_share_of_the_calls_over_a_window() -> None:
    clock = FakeClock()
    state = HedgeState(clock)
    policy = HedgePolicy(budget=0.05)
    for _ in range(40):
        state.record_call(policy)
    assert [state.try_spend(policy) for _ in range(3)] == [True, True, False]
    clock.advance(11)  # the window slid past those calls
    assert not state.try_spend(policy)
    assert state.budget_state(policy).refused == 2


def test_a_hedge_never_goes_to_the_primarys_endpoint_nor_one_out_of_rotation() -> None:
    clock = FakeClock()
    client = stormguard.Client(
        base_url=["http://h0.test/v1", "http://h1.test/v1", "http://h2.test/v1"],
        model="m",
        api_key="k",
        clock=clock,
        ejection=stormguard.EjectionConfig(probe=unreachable),
    )
    core = client._core
    spec = core.chat_spec(
        messages=MESSAGES, model=None, stream=False, extras=CallExtras(), params={}
    )
    call = LogicalCall(core, spec)
    h0, h1, h2 = core.picker.states
    call._endpoint_choice = h0  # the primary's attempt is on h0
    for _ in range(20):
        assert hedge_target(call) in (h1, h2)
    # h1 sheds: only h2.
    core.picker.observe(h1, stormguard.ServerLoad(queue_depth=1, load_shed="overloaded"))
    assert {hedge_target(call) for _ in range(20)} == {h2}
    # h2 paused by its limiter: none.
    assert core.limiter is not None
    core.limiter.endpoint(h2.name).pause(30)
    assert hedge_target(call) is None
    clock.advance(31)
    core.picker.observe(h1, stormguard.ServerLoad(queue_depth=1, load_shed="overloaded"))
    assert hedge_target(call) is h2
    # h2's breaker open: none.
    assert core.breakers is not None
    breaker = core.breakers.get(h2.name, "m")
    while breaker.accepting:
        breaker.before_call().failure()
    assert hedge_target(call) is None
    client.close()
