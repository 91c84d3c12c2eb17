"""The states of one logical call, and the steps between them (sans-IO, h11-style).

``LogicalCall`` moves through a ``CallMachine`` at each step a driver (or a
stream) takes; a step the table does not allow from the current state raises
``CallProtocolError``: a bug in stormguard's own ordering, never the caller's
or the server's, so it is outside the ``StormguardError`` tree.

::

          IDLE ◀───────────────────────── fall_back ──────────────────────┐
           │ └── precheck ──▶ PRECHECK                                    │
           │                     │                                        │
           │   pace (from IDLE, PRECHECK, BACKING_OFF; again from PACING) │
           ▼                     ▼                                        │
         PACING ─────────── stop (its deadline cannot be met) ─────▶ STOPPED
           │                                                              ▲
        reserve (also from IDLE, PRECHECK, without a paced key)           │
           ▼                                                              │
      WAITING_FOR_SLOT ◀─────────────────── reserve ─── BACKING_OFF       │
           │   └──────────── stop (a refusal here) ───────────────────────┤
      begin_attempt                                          ▲            ▲
           ▼                                              back_off        │
        SENDING ──────── failed ───────▶ ATTEMPT_FAILED ─────┘── stop ────┤
           │                                  ▲                           │
      saw_response                            │                           │
           ▼                                  │                           │
       RECEIVING ─────── failed ──────────────┘                           │
           │     └────────────── stop (cancelled in flight) ──────────────┘
       succeeded
           ▼
      HANDED_OVER ──── end ────▶ DONE        end: from any state; DONE is final

``SENDING`` and ``RECEIVING`` are an attempt in flight (its breaker permit and
throttle not yet told); ``ATTEMPT_FAILED`` is an attempt settled as failed whose
record the retry loop has yet to close (as a retry, a requeue, a paced retry, a
failover, or with the stop reason). ``PACING``: the call waits for its share of
its key's quota before an attempt (only once a quota signal turned the key's
pacing on; otherwise the call goes straight to ``reserve``). ``HANDED_OVER``:
the attempt succeeded and the caller holds the answer (a result, a stream after
its first chunk, a body not yet read); the call ends when the caller is done
with it. A cancellation or an
unexpected error stops the loop from an attempt still in flight, and a local
refusal (open breakers, the throttle, a full or slow local queue, a deadline
that passed) from ``WAITING_FOR_SLOT``.
"""

from __future__ import annotations

import enum

__all__ = ["ATTEMPT_OPEN", "IN_FLIGHT", "CallMachine", "CallProtocolError", "CallState"]


class CallState(enum.Enum):
    """Where one logical call is."""

    #: Created, or moved to a fallback model: no attempt on this model yet.
    IDLE = "idle"
    #: The token pre-check runs (lookups, the rate limiter's reservation).
    PRECHECK = "precheck"
    #: The call waits for its share of its key's quota (``_policies/quota``).
    PACING = "pacing"
    #: An endpoint is chosen; the call waits for (or just got) a concurrency slot.
    WAITING_FOR_SLOT = "waiting_for_slot"
    #: The attempt's request is built and going out; no response yet.
    SENDING = "sending"
    #: The response's headers are in; its body (or a stream's first chunk) is read.
    RECEIVING = "receiving"
    #: The attempt failed and was settled; the retry loop decides what follows.
    ATTEMPT_FAILED = "attempt_failed"
    #: A retry or a requeue is decided: the call sleeps before the next attempt.
    BACKING_OFF = "backing_off"
    #: The retry loop stopped (``retry_stopped_by``): fall back or raise.
    STOPPED = "stopped"
    #: The attempt succeeded and the caller holds the answer.
    HANDED_OVER = "handed_over"
    #: The call's end was reported: nothing more happens.
    DONE = "done"


S = CallState
#: An attempt in flight: its permit and the throttle are not told yet.
IN_FLIGHT = frozenset({S.SENDING, S.RECEIVING})
#: An attempt whose record is still open (in flight, or failed and not yet closed).
ATTEMPT_OPEN = IN_FLIGHT | {S.ATTEMPT_FAILED}
_ANY = frozenset(S)

#: step -> (the states it may be taken from, the state it leads to).
TRANSITIONS: dict[str, tuple[frozenset[CallState], CallState]] = {
    "precheck": (frozenset({S.IDLE}), S.PRECHECK),
    "pace": (frozenset({S.IDLE, S.PRECHECK, S.BACKING_OFF, S.PACING}), S.PACING),
    "reserve": (
        frozenset({S.IDLE, S.PRECHECK, S.PACING, S.WAITING_FOR_SLOT, S.BACKING_OFF}),
        S.WAITING_FOR_SLOT,
    ),
    "begin_attempt": (frozenset({S.WAITING_FOR_SLOT}), S.SENDING),
    "saw_response": (frozenset({S.SENDING}), S.RECEIVING),
    "failed": (IN_FLIGHT, S.ATTEMPT_FAILED),
    # A retry after an error raised before the attempt went out (a deadline that
    # passed while choosing the endpoint) backs off from WAITING_FOR_SLOT.
    "back_off": (frozenset({S.ATTEMPT_FAILED, S.WAITING_FOR_SLOT}), S.BACKING_OFF),
    "stop": (frozenset({S.WAITING_FOR_SLOT, S.PACING}) | ATTEMPT_OPEN, S.STOPPED),
    # Again from HANDED_OVER: a body read after the hand-over completes the result.
    "succeeded": (frozenset({S.RECEIVING, S.HANDED_OVER}), S.HANDED_OVER),
    # A fallback replaces a stopped model, or one whose pre-check or discovery failed.
    "fall_back": (frozenset({S.STOPPED, S.PRECHECK, S.IDLE}), S.IDLE),
    "end": (_ANY, S.DONE),
}


class CallProtocolError(RuntimeError):
    """A step taken in a state that does not allow it: a bug in stormguard, not an
    error of the call (it is not a ``StormguardError``)."""


class CallMachine:
    """The current ``CallState`` of one call, moved only by the steps of ``TRANSITIONS``.

    >>> machine = CallMachine()
    >>> machine.step("reserve")  # returns the state it left
    <CallState.IDLE: 'idle'>
    >>> _ = machine.step("begin_attempt"); machine.state
    <CallState.SENDING: 'sending'>
    >>> machine.step("succeeded")
    Traceback (most recent call last):
    ...
    stormguard._call.call_state.CallProtocolError: step 'succeeded' in state sending
    """

    __slots__ = ("state",)

    def __init__(self) -> None:
        self.state = CallState.IDLE

    def step(self, name: str) -> CallState:
        """Take the step ``name``; returns the state it left."""
        allowed, to = TRANSITIONS[name]
        left = self.state
        if left not in allowed:
            raise CallProtocolError(f"step {name!r} in state {left.value}")
        self.state = to
        return left

    def __repr__(self) -> str:
        return f"CallMachine({self.state.value})"
