"""Prefix-cache affinity in the picker, on a fake clock and a seeded rng: a key's
endpoint by weighted rendezvous hashing, bounded loads, what it skips, what a
change of the set moves, and that a call without a key is chosen as before."""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stormguard import AffinityPolicy, Endpoint, Priority, ServerLoad, SpillOver
from stormguard._policies.routing import picker as picker_module
from stormguard._policies.routing.affinity import (
    affinity_choice,
    key_of,
    load_bound,
    ranking,
)
from stormguard._policies.routing.endpoint_state import EndpointState
from stormguard._policies.routing.picker import EndpointPicker
from stormguard.testing import FakeClock

URLS = [f"http://r{i}.test/v1" for i in range(6)]
ROOM = ServerLoad(queue_depth=0, inflight_tokens=0, token_capacity=1000)


def picker(*endpoints: Endpoint, seed: int = 0) -> tuple[EndpointPicker, FakeClock]:
    clock = FakeClock()
    return EndpointPicker(endpoints, clock=clock, rng=random.Random(seed)), clock


def fleet(n: int, **kwargs: object) -> list[Endpoint]:
    return [Endpoint(url, **kwargs) for url in URLS[:n]]  # type: ignore[arg-type]


def key(name: str) -> bytes:
    digest = AffinityPolicy().key_of({"prompt_cache_key": name})
    assert digest is not None
    return digest


def first(pick: EndpointPicker, k: bytes, **kwargs: object) -> str:
    return pick.candidates(affinity_key=k, **kwargs)[0].name  # type: ignore[arg-type]


def chi_square(counts: Sequence[int], shares: Sequence[float]) -> float:
    total = sum(counts)
    return sum((c - total * p) ** 2 / (total * p) for c, p in zip(counts, shares, strict=True))


#: The chi-square distribution's 99.9th percentile at 2 and 3 degrees of freedom.
CHI2_999 = {2: 13.82, 3: 16.27}


def test_the_same_key_goes_to_the_same_endpoint_in_every_process() -> None:
    # Two pickers with different random draws agree: the ranking is a stable hash
    # (BLAKE2b), not Python's per-process salted hash().
    one, _ = picker(*fleet(3), seed=1)
    two, _ = picker(*fleet(3), seed=99)
    for i in range(50):
        k = key(f"conversation-{i}")
        homes = {first(one, k) for _ in range(5)} | {first(two, k)}
        assert len(homes) == 1
    # Pinned: a change of hash or encoding would move every key of every client
    # (and disagree with the clients of the version before, in a rolling deploy).
    assert key("conversation-0").hex() == "8407ee5be6d35cf2d73d9656327c45fc"
    assert [s.name for s in ranking(key("abc"), one.states)] == [
        s.name for s in ranking(key("abc"), list(reversed(one.states)))
    ]


def test_keys_spread_evenly_over_equal_endpoints() -> None:
    pick, _ = picker(*fleet(3))
    counts = Counter(first(pick, key(f"user-{i}")) for i in range(3000))
    assert len(counts) == 3
    assert chi_square(list(counts.values()), [1 / 3] * 3) < CHI2_999[2]


def test_weights_share_the_keys() -> None:
    pick, _ = picker(
        Endpoint(URLS[0], weight=1.0), Endpoint(URLS[1], weight=2.0), Endpoint(URLS[2], weight=1.0)
    )
    counts = Counter(first(pick, key(f"user-{i}")) for i in range(4000))
    observed = [counts[f"r{i}.test:80"] for i in range(3)]
    assert chi_square(observed, [0.25, 0.5, 0.25]) < CHI2_999[2]


def test_removing_one_endpoint_moves_only_its_keys_and_adding_it_back_only_to_it() -> None:
    pick, _ = picker(*fleet(4))
    keys = [key(f"doc-{i}") for i in range(2000)]
    before = {k: first(pick, k) for k in keys}
    gone = pick.states[2]
    pick.replace([s for s in pick.states if s is not gone])
    after = {k: first(pick, k) for k in keys}
    for k in keys:
        if before[k] != gone.name:
            assert after[k] == before[k]
        else:
            assert after[k] != gone.name
    moved = sum(before[k] != after[k] for k in keys)
    assert moved == sum(home == gone.name for home in before.values())
    assert 350 < moved < 650  # about a quarter of the keys
    pick.replace([*pick.states, EndpointState(Endpoint(URLS[2]))])
    again = {k: first(pick, k) for k in keys}
    assert again == before  # each returning key goes back to the endpoint it had


def test_one_hot_key_never_puts_more_than_its_bound_on_an_endpoint() -> None:
    for weights in ([1.0, 1.0, 1.0], [1.0, 2.0, 1.0, 4.0]):
        pick, _ = picker(*(Endpoint(u, weight=w) for u, w in zip(URLS, weights, strict=False)))
        total_weight = sum(weights)
        hot = key("one long system prompt every call shares")
        order = [s.name for s in ranking(hot, pick.states)]
        placed: list[str] = []
        for _ in range(400):  # none finishes: all in flight at once
            state = pick.candidates(affinity_key=hot)[0]
            pick.started(state)
            placed.append(state.name)
            total = sum(s.in_flight for s in pick.states)
            for s in pick.states:
                share = total * s.weight / total_weight
                bound = max(1.25 * share, share + 2)  # the default epsilon and slack
                assert s.in_flight <= math.ceil(bound + 1e-9), (s, total)
        # The home takes what it can; the overflow goes down the key's ranking, in
        # its order (the last may never be needed: the bounds add up to 1.25 times all).
        used = list(dict.fromkeys(placed))
        assert used == order[: len(used)] and len(used) >= 2
        # At 400 in flight the slack is far below epsilon's quarter: the paper's bound.
        home = next(s for s in pick.states if s.name == order[0])
        assert home.in_flight <= math.ceil(1.25 * 400 * home.weight / total_weight + 1e-9)


def test_slack_keeps_a_few_calls_home_and_one_hot_key_still_spills_when_busy() -> None:
    # Two endpoints, each call's key homes on the first of its ranking.
    for in_flight, epsilon_only, with_slack in ((1, 1, 3), (6, 4, 5), (64, 40, 40)):
        # The bound for the call that makes ``in_flight``: the others are in flight.
        assert load_bound(in_flight - 1, 0.5, 0.25) == epsilon_only
        assert load_bound(in_flight - 1, 0.5, 0.25, 2) == with_slack
    pick, _ = picker(Endpoint(URLS[0]), Endpoint(URLS[1]))
    hot = key("a chat's history")
    home, other = ranking(hot, pick.states)
    for _ in range(4):
        pick.started(home)
    pick.started(other)
    # 5 in flight, 4 of them at the home: the 6th still goes home (epsilon alone: away).
    assert pick.candidates(affinity_key=hot)[0] is home
    assert pick.candidates(affinity_key=hot, slack=0)[0] is other
    pick.started(home)
    pick.finished(other)  # 5 in flight, all at the home: the 6th leaves it
    assert pick.candidates(affinity_key=hot)[0] is other
    # Busy: one hot key fills its home to its bound, then spills over (and moves,
    # back and forth as each fills): never past 1.25 times a share at 64 in flight.
    busy, _ = picker(Endpoint(URLS[0]), Endpoint(URLS[1]))
    placed: Counter[str] = Counter()
    for _ in range(64):
        state = busy.candidates(affinity_key=hot)[0]
        busy.started(state)
        placed[state.name] += 1
        total = sum(placed.values())
        assert state.in_flight <= max(load_bound(total - 1, 0.5, 0.25, 2), 1)
    assert placed[home.name] <= 40 and placed[other.name] <= 40


def fill(pick: EndpointPicker, state: EndpointState, calls: int) -> None:
    for _ in range(calls):
        pick.started(state)


def test_a_key_whose_home_is_full_moves_and_its_later_calls_follow_it() -> None:
    pick, _ = picker(*fleet(3))
    k = key("chat-11")
    home, second, third = ranking(k, pick.states)
    fill(pick, home, 5)  # 5 in flight, all at the home: at its bound (6 / 3 + 2)
    order, moved_home = pick.choose(affinity_key=k)
    assert order[0] is second and moved_home is home  # this call overflows
    pick.started(second)
    for _ in range(5):
        pick.finished(home)  # the home is empty again
    # The key's prefix is newest on ``second`` now: its next calls go there, and
    # ``second`` is the home they report a hit against.
    for _ in range(3):
        assert pick.choose(affinity_key=k) == ([second, *order[1:]], second)
    other = key("chat-12")
    assert first(pick, other) == ranking(other, pick.states)[0].name  # others stay
    # Full in turn, the moved key walks its ranking from the top: home again.
    fill(pick, second, 4)
    order, moved_home = pick.choose(affinity_key=k)
    assert order[0] is home and moved_home is second
    for _ in range(5):
        pick.finished(second)
    assert pick.choose(affinity_key=k)[1] is home
    assert third.in_flight == 0


def test_a_home_passed_over_while_shedding_avoided_or_ejected_keeps_its_key() -> None:
    pick, clock = picker(*fleet(3))
    k = key("chat-13")
    home, second, _ = ranking(k, pick.states)
    pick.observe(home, ServerLoad(queue_depth=9, load_shed="queue_full"))
    assert first(pick, k) == second.name
    assert first(pick, k, avoid={home.name}) == second.name
    assert first(pick, k, usable=lambda s: s is not home) == second.name
    clock.advance(6.0)  # the shed report is stale: back home, as it never moved
    order, same_home = pick.choose(affinity_key=k)
    assert order[0] is home and same_home is home


def test_a_key_moved_to_an_endpoint_that_left_goes_home() -> None:
    pick, _ = picker(*fleet(3))
    k = key("chat-14")
    home, second, third = ranking(k, pick.states)
    fill(pick, home, 5)
    assert first(pick, k) == second.name  # moved to ``second``
    for _ in range(5):
        pick.finished(home)
    pick.replace([home, third])  # discovery: ``second`` is gone
    assert first(pick, k) == home.name
    pick.replace([home, second, third])  # back: the key's newest prefix is there
    assert first(pick, k) == second.name


def test_the_moved_keys_a_picker_remembers_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(picker_module, "MOVED_KEYS", 4)
    pick, _ = picker(*fleet(2))
    keys = [key(f"chat-{i}") for i in range(40)]
    homes = {k: ranking(k, pick.states)[0] for k in keys}
    moved: list[bytes] = []
    for k in keys:
        home = homes[k]
        fill(pick, home, 5)  # at its bound of two endpoints' (6 / 2 + 2)
        state = pick.candidates(affinity_key=k)[0]
        for _ in range(5):
            pick.finished(home)
        if state is not home:
            moved.append(k)
    assert len(moved) == len(keys)  # each left a full home
    assert len(pick._moves) == 4
    # The four last moved are remembered; the rest go home again.
    for k in moved:
        at = first(pick, k)
        assert (at != homes[k].name) == (k in moved[-4:]), k


def test_load_bound() -> None:
    assert load_bound(0, 1 / 3, 0.25) == 1  # the first call may go anywhere
    assert load_bound(3, 0.25, 0.25) == 2  # 1.25 * 4 * 0.25 = 1.25
    assert load_bound(9, 1 / 3, 0.25) == 5  # 1.25 * 10 / 3 = 4.17
    assert load_bound(99, 0.5, 1.0) == 100
    assert load_bound(0, 1 / 3, 0.25, 2) == 3  # a third of one call, plus two
    assert load_bound(99, 0.5, 0.25, 2) == 63  # 1.25 * 50 = 62.5, over 50 + 2


def test_a_shedding_endpoint_is_skipped_while_its_report_is_fresh() -> None:
    pick, clock = picker(*fleet(3))
    k = key("chat-7")
    home, second = ranking(k, pick.states)[:2]
    pick.observe(home, ServerLoad(queue_depth=9, load_shed="queue_full"))
    order, chosen_home = pick.choose(affinity_key=k)
    assert order[0] is second and chosen_home is home
    clock.advance(6.0)  # its report is stale: the key goes home again
    assert pick.choose(affinity_key=k)[0][0] is home


def test_an_endpoint_out_of_rotation_is_not_ranked_and_its_keys_go_to_their_next() -> None:
    pick, _ = picker(*fleet(3))
    k = key("chat-8")
    home, second, _ = ranking(k, pick.states)
    order, new_home = pick.choose(affinity_key=k, usable=lambda s: s is not home)  # ejected
    assert order[0] is second and new_home is second
    assert home not in order


def test_a_retry_avoids_the_endpoint_it_tried() -> None:
    pick, _ = picker(*fleet(3))
    k = key("chat-9")
    home, second, third = ranking(k, pick.states)
    order, same_home = pick.choose(affinity_key=k, avoid={home.name})
    assert order[0] is second and same_home is home
    assert order[-1] is home  # avoided: last, as without a key
    assert pick.choose(affinity_key=k, avoid={home.name, second.name})[0][0] is third
    every, _ = pick.choose(affinity_key=k, avoid={s.name for s in pick.states})
    assert len(every) == 3  # none fits: by load, as without a key


def test_no_fit_falls_back_to_the_order_without_a_key() -> None:
    pick, _ = picker(*fleet(3), seed=5)
    reference, _ = picker(*fleet(3), seed=5)
    k = key("chat-10")
    for state in pick.states:
        pick.observe(state, ServerLoad(queue_depth=3, load_shed="queue_full"))
    for state in reference.states:
        reference.observe(state, ServerLoad(queue_depth=3, load_shed="queue_full"))
    for _ in range(20):  # the same rng draws as a picker asked without a key
        assert [s.name for s in pick.candidates(affinity_key=k)] == [
            s.name for s in reference.candidates()
        ]


def test_without_a_key_the_order_and_the_draws_are_unchanged() -> None:
    pick, _ = picker(*fleet(4), seed=11)
    reference, _ = picker(*fleet(4), seed=11)
    for i, state in enumerate(pick.states):
        pick.observe(state, ServerLoad(queue_depth=i % 3))
        reference.observe(reference.states[i], ServerLoad(queue_depth=i % 3))
    for _ in range(50):
        got, no_home = pick.choose(avoid="r1.test:80")
        assert no_home is None
        assert [s.name for s in got] == [s.name for s in reference.candidates(avoid="r1.test:80")]


def test_affinity_stays_in_the_own_pool_and_its_best_tier() -> None:
    interactive = {"critical", "standard"}
    pick, _ = picker(
        Endpoint(URLS[0], classes=interactive),
        Endpoint(URLS[1], classes=interactive),
        Endpoint(URLS[2], classes={"sheddable"}),
        Endpoint(URLS[3], classes={"sheddable"}),
    )
    for state in pick.states:
        pick.observe(state, ROOM)
    batch = pick.states[2:]
    for i in range(200):
        order = pick.candidates(
            affinity_key=key(f"job-{i}"), priority=Priority.SHEDDABLE, spill=SpillOver()
        )
        assert order[0] in batch and order[1] in batch  # own pool first, spill-over after
        assert set(order[2:]) == set(pick.states[:2])
    tiered, _ = picker(*fleet(4))
    for state in tiered.states[2:]:
        state.tier = 2
    for i in range(200):
        order = tiered.candidates(affinity_key=key(f"job-{i}"))
        assert {s.tier for s in order[:2]} == {1} and {s.tier for s in order[2:]} == {2}
    # The best tier with one endpoint of the own pool in rotation: nothing to rank.
    solo, no_home = tiered.choose(affinity_key=key("x"), usable=lambda s: s.name != "r0.test:80")
    assert no_home is None and solo[0].name == "r1.test:80"


def test_affinity_choice_alone_over_states() -> None:
    states = [EndpointState(e) for e in fleet(3)]
    k = key("alone")
    home, chosen = affinity_choice(k, states, epsilon=0.25, skip=lambda s: False)
    assert home is chosen is ranking(k, states)[0]
    home.in_flight = 2  # 2 of 2 in flight: its bound is ceil(1.25 * 3 / 3) = 2
    home2, chosen2 = affinity_choice(k, states, epsilon=0.25, skip=lambda s: False)
    assert home2 is home and chosen2 is ranking(k, states)[1]


# -- the key --------------------------------------------------------------------------

DERIVE = AffinityPolicy(derive_from_prompt=True)
SYSTEM = {"role": "system", "content": "You are a terse assistant. " * 20}


def conversation(opening: str, turns: int) -> list[dict[str, str]]:
    messages = [SYSTEM, {"role": "user", "content": opening}]
    for i in range(turns):
        messages += [
            {"role": "assistant", "content": f"answer {i}"},
            {"role": "user", "content": f"follow-up {i}"},
        ]
    return messages


def test_a_derived_key_is_the_same_across_a_conversations_turns() -> None:
    turns = [conversation("Plan a trip", t) for t in range(5)]
    keys = {DERIVE.key_of({"model": "m", "messages": messages}) for messages in turns}
    assert len(keys) == 1 and None not in keys
    other = DERIVE.key_of({"model": "m", "messages": conversation("Fix my code", 2)})
    assert other is not None and other not in keys
    # Key order in a message does not matter (canonical form).
    swapped = [{"content": m["content"], "role": m["role"]} for m in conversation("Plan a trip", 1)]
    assert DERIVE.key_of({"messages": swapped}) in keys


def test_keys_of_prompts_and_inputs_read_their_start_only() -> None:
    policy = AffinityPolicy(derive_from_prompt=True, prefix_chars=100)
    doc = "x" * 100
    assert policy.key_of({"prompt": doc + "question 1"}) == policy.key_of({"prompt": doc + "q2"})
    assert policy.key_of({"prompt": "a" + doc}) != policy.key_of({"prompt": "b" + doc})
    one = policy.key_of({"instructions": "be brief", "input": "hello"})
    assert one is not None and one != policy.key_of({"instructions": "be long", "input": "hello"})
    assert policy.key_of({"input": [{"role": "user", "content": doc + "1"}]}) == policy.key_of(
        {"input": [{"role": "user", "content": doc + "2"}]}
    )


def test_the_callers_prompt_cache_key_comes_first_and_is_honoured_without_deriving() -> None:
    body = {"messages": conversation("Plan a trip", 0), "prompt_cache_key": "user-42"}
    assert AffinityPolicy().key_of(body) == DERIVE.key_of(body) == key("user-42")
    assert AffinityPolicy().key_of({"messages": body["messages"]}) is None
    # A key given and one derived never collide, whatever the text.
    assert DERIVE.key_of({"prompt": "user-42"}) != key("user-42")
    for empty in ({"prompt_cache_key": ""}, {"prompt_cache_key": 7}, {}, {"messages": []}):
        assert AffinityPolicy().key_of(empty) is None


class Opaque:
    pass


def _nested(depth: int) -> list[object]:
    value: list[object] = ["x"]
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "body",
    [
        None,
        {"messages": "not a list"},
        {"messages": [Opaque()]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "x": Opaque()}]}]},
        {"messages": [{"role": "user", "content": [1, 2.5, None, True, {"t": b"bytes"}]}]},
        {"prompt": [1, 2, 3]},
        {"prompt": Opaque()},
        {"input": {"deep": _nested(100)}},
        {"messages": [{"role": "user", "content": "\udcff lone surrogate"}]},
        {"messages": [{"role": 3, "content": {"nested": {"a": [float("nan")]}}}]},
    ],
)
def test_hostile_bodies_have_no_key_or_a_key_never_an_error(body: object) -> None:
    got = key_of(body, derive=True, prefix_chars=64)  # type: ignore[arg-type]
    assert got is None or len(got) == 16
    if "Opaque" in repr(body) or "deep" in repr(body)[:20]:
        assert got is None  # no canonical form: no key, and the call goes by load


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.binary(),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(max_size=5) | st.integers(), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(
    body=st.dictionaries(
        st.sampled_from(["messages", "prompt", "input", "instructions", "prompt_cache_key"]),
        JSONISH,
    ),
    chars=st.integers(min_value=1, max_value=50),
)
def test_any_body_has_a_key_or_none_never_an_error(body: dict[str, object], chars: int) -> None:
    got = key_of(body, derive=True, prefix_chars=chars)
    assert got is None or len(got) == 16


def test_a_huge_prompt_costs_what_its_prefix_costs() -> None:
    policy = AffinityPolicy(derive_from_prompt=True, prefix_chars=1000)
    huge = "y" * 20_000_000
    messages = [{"role": "user", "content": [{"type": "text", "text": huge}] * 3}]
    started = time.perf_counter()
    one = policy.key_of({"messages": messages})
    assert time.perf_counter() - started < 0.5  # cut before it is serialised, not after
    cut = [{"role": "user", "content": [{"type": "text", "text": "y" * 1000}]}]
    assert one is not None and one == policy.key_of({"messages": cut})
    many = [{"role": "system", "content": "s"}] * 1_000_000
    assert policy.key_of({"messages": many}) is not None


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"epsilon": 0}, ValueError),
        ({"epsilon": -1.0}, ValueError),
        ({"epsilon": float("inf")}, ValueError),
        ({"epsilon": True}, ValueError),
        ({"slack": -1}, ValueError),
        ({"slack": 1.5}, ValueError),
        ({"slack": True}, ValueError),
        ({"epsilon": "0.25"}, ValueError),
        ({"prefix_chars": 0}, ValueError),
        ({"prefix_chars": 1.5}, ValueError),
        ({"derive_from_prompt": "yes"}, TypeError),
    ],
)
def test_bad_policies_are_clear_errors(kwargs: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error, match=next(iter(kwargs))):
        AffinityPolicy(**kwargs)  # type: ignore[arg-type]
