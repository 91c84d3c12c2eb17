"""The call's state machine: the paths a call takes, and that a wrong step raises."""

from __future__ import annotations

import pytest

from stormguard import StormguardError
from stormguard._call.call_state import TRANSITIONS, CallMachine, CallProtocolError, CallState

S = CallState

PATHS = {
    "success": ["reserve", "begin_attempt", "saw_response", "succeeded", "end"],
    "precheck-then-success": [
        "precheck",
        "reserve",
        "begin_attempt",
        "saw_response",
        "succeeded",
        "end",
    ],
    "retry-then-success": [
        "reserve",
        "begin_attempt",
        "failed",
        "back_off",
        "reserve",
        "begin_attempt",
        "saw_response",
        "succeeded",
        "end",
    ],
    "status-error-retried": [
        "reserve",
        "begin_attempt",
        "saw_response",
        "failed",
        "back_off",
        "reserve",
        "begin_attempt",
        "saw_response",
        "succeeded",
        "end",
    ],
    "stopped-then-fallback": [
        "reserve",
        "begin_attempt",
        "saw_response",
        "failed",
        "stop",
        "fall_back",
        "precheck",
        "reserve",
        "begin_attempt",
        "saw_response",
        "succeeded",
        "end",
    ],
    "refused-locally": ["reserve", "stop", "end"],
    "slot-then-ejected-endpoint": ["reserve", "reserve", "begin_attempt", "failed", "stop"],
    "cancelled-in-flight": ["reserve", "begin_attempt", "stop", "end"],
    "body-read-after-hand-over": [
        "reserve",
        "begin_attempt",
        "saw_response",
        "succeeded",
        "succeeded",
        "end",
        "end",
    ],
    "deadline-before-the-attempt-started": ["reserve", "back_off", "reserve", "stop"],
}


@pytest.mark.parametrize("steps", PATHS.values(), ids=PATHS.keys())
def test_the_paths_a_call_takes(steps: list[str]) -> None:
    machine = CallMachine()
    for step in steps:
        machine.step(step)


def test_a_call_starts_idle_and_ends_done() -> None:
    machine = CallMachine()
    assert machine.state is S.IDLE
    for step in PATHS["success"]:
        machine.step(step)
    assert machine.state is S.DONE
    assert machine.step("end") is S.DONE  # a second end is reported as no news


WRONG = [
    (state, step)
    for step, (allowed, _) in TRANSITIONS.items()
    for state in CallState
    if state not in allowed
]


@pytest.mark.parametrize(("state", "step"), WRONG, ids=[f"{s.value}-{t}" for s, t in WRONG])
def test_a_wrong_step_raises(state: CallState, step: str) -> None:
    machine = CallMachine()
    machine.state = state
    with pytest.raises(CallProtocolError, match=f"step '{step}' in state {state.value}"):
        machine.step(step)
    assert machine.state is state


def test_a_wrong_step_is_a_bug_not_a_call_error() -> None:
    assert not issubclass(CallProtocolError, StormguardError)


def test_nothing_follows_done_but_end() -> None:
    assert [step for step, (allowed, _) in TRANSITIONS.items() if S.DONE in allowed] == ["end"]


def test_every_state_is_reachable_from_idle() -> None:
    reached, frontier = {S.IDLE}, [S.IDLE]
    while frontier:
        state = frontier.pop()
        for allowed, to in TRANSITIONS.values():
            if state in allowed and to not in reached:
                reached.add(to)
                frontier.append(to)
    assert reached == set(CallState)
