"""A hedged call's race, without I/O: when a hedge goes, where, who won, and what
the call returns. The drivers (``_call/drivers.py``) run the racers, anyio tasks
for the async client, threads for the sync one, and cancel the loser (sync: its
sockets shut down, ``AttemptAbandoned`` at its next step).

The rules (docs/resilience.md, "Hedged requests"), those of gRPC's
``hedgingPolicy`` (gRFC A6) cut to one hedge:

- The call's own attempts (the **primary**) run as any call's: pre-check,
  quota, retries, fallback. After the delay (``HedgeState.delay_for``) with no
  answer, one **hedge** goes: the same request, one attempt, to another endpoint
  (``endpoint_choice.hedge_target``), paid from the hedge budget. None goes when
  the primary has ended, when the call's key is paced to its quota (a hedge would
  spend the quota twice), when no other endpoint can take it, or when the budget
  is spent; the last two are counted in ``client.stats()`` (once a call), and the
  call asks again while its primary waits (gRPC sends a hedge at each delay that
  throttling allows): the budget refills as calls come, and the call that has
  waited longest is the one that most needs its hedge. The waits between asks
  double from the delay to at most ``MAX_ASK_INTERVAL`` (``next_ask``), so that a
  thousand calls held back in an overloaded fleet do not each ask every few
  milliseconds.
- The first answer wins (a plain call: a complete 2xx; a stream: its first
  chunk, the moment the attempt succeeds for every other policy too); the other
  racer is cancelled at once, its connection closed, so the server aborts it.
- A racer that fails leaves the other running: the call fails only when both
  have, with the primary's error. The hedge has no retry of its own.
- Both racers share the call's token reservation (``SharedReservation``): the
  winner's usage settles it once; it goes back only when both have failed.
- The loser's records join the winner's (``attempt_history``), its last attempt
  marked ``hedge_lost``; the hedge's are marked ``hedge``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .._core.exceptions import StormguardError
from .._core.fork import fork_safe_lock
from .._core.history import AttemptRecord
from .._core.http import response_types
from .._core.results import CALL_INFO_EXTENSION, APIResult, CallInfo
from .._core.stop_reason import StopReason
from ..tokens._rate_limit import Reservation
from .call_base import HEDGE_LOST
from .call_result import Delivery
from .endpoint_choice import hedge_target
from .pipeline import LogicalCall
from .stats import HEDGE_NO_BUDGET, HEDGE_NO_ENDPOINT, HEDGE_SENT, HEDGE_WON
from .streaming import _StreamBase

if TYPE_CHECKING:
    from .._core.http import httpx
    from .._policies.hedge.policy import HedgePolicy
    from .call_spec import CallSpec
    from .client_core import ClientCore

__all__ = ["MAX_ASK_INTERVAL", "Race", "Racer", "SharedReservation", "info_of"]

#: The longest wait in seconds between two asks for a held-back hedge (unless the
#: delay itself is longer).
MAX_ASK_INTERVAL = 1.0


class SharedReservation(Reservation):
    """The call's token reservation, held by both racers: the first ``settle`` (the
    winner's usage) counts, and a ``cancel`` only once both racers gave it back (both
    failed). A cancelled loser does neither."""

    def __init__(self, reservation: Reservation) -> None:
        self.tokens, self.wait = reservation.tokens, reservation.wait
        self._reservation = reservation
        self._cancels = 0
        self._lock_ = fork_safe_lock()

    def settle(self, actual_tokens: int) -> None:
        self._reservation.settle(actual_tokens)

    def cancel(self) -> None:
        with self._lock_:
            self._cancels += 1
            last = self._cancels == 2
        if last:
            self._reservation.cancel()


class Racer:
    """One side of the race: its call, and how it ended (``done``)."""

    __slots__ = ("abandoned", "call", "done", "error", "result")

    def __init__(self, call: LogicalCall) -> None:
        self.call = call
        self.done = False
        #: The race is over without it: its driver gives it up (sync: its thread
        #: stops at its next step, its socket shut down).
        self.abandoned = False
        self.result: Any = None
        self.error: BaseException | None = None


class Race:
    """A hedged call: its primary, its hedge once sent, the winner. Its methods are
    called from the racers' tasks or threads, under one lock."""

    def __init__(
        self,
        core: ClientCore,
        spec: CallSpec,
        http: httpx.Client | httpx.AsyncClient,
        policy: HedgePolicy,
    ) -> None:
        self.core = core
        self.policy = policy
        self.primary = Racer(LogicalCall(core, spec, http))
        self.hedge: Racer | None = None
        self.winner: Racer | None = None
        #: The budget or the endpoints held the hedge back: asked again after
        #: ``next_ask``; and whether a hedge not sent was counted (once a call).
        self._held_back = False
        self._counted = False
        self._asks = 0
        self._lock = fork_safe_lock()
        core.hedging.record_call(policy)
        self.started = core.clock.now()
        #: Seconds before the hedge (None: no hedge, too few latencies known yet).
        self.delay = core.hedging.delay_for(spec.model, policy)

    def over(self) -> bool:
        """Whether the race is decided: a racer answered, or every racer sent failed."""
        with self._lock:
            return self._over()

    def _over(self) -> bool:
        if self.winner is not None:
            return True
        hedge = self.hedge
        return self.primary.done and (hedge is None or hedge.done)

    def send_hedge(self) -> LogicalCall | None:
        """At a delay: the hedge to run, or None (the race is over, or no hedge may go
        now: counted once a call when the budget, the quota or the endpoints are why;
        ``may_hedge_later`` says whether to ask again)."""
        with self._lock:
            primary = self.primary.call
            if self._over() or self.hedge is not None:
                return None
            stats = self.core.stats
            quota = primary._quota
            if quota is not None and quota.state() is not None:
                # The call's key is paced: a hedge would spend its quota twice.
                self._held_back = False
                self._count(HEDGE_NO_BUDGET)
                return None
            try:
                target = hedge_target(primary)
            except (StormguardError, ValueError):  # none serves it now (a set just changed)
                target = None
            if target is None:
                self._held_back = True
                self._count(HEDGE_NO_ENDPOINT)
                return None
            if not self.core.hedging.try_spend(self.policy):
                self._held_back = True
                self._count(HEDGE_NO_BUDGET)
                return None
            hedge = LogicalCall.hedge_of(primary, target)
            reservation = primary._reservation
            if reservation is not None:
                primary._reservation = hedge._reservation = SharedReservation(reservation)
            self.hedge = Racer(hedge)
            stats.hedge(HEDGE_SENT)
            return hedge

    def _count(self, reason: int) -> None:
        if not self._counted:
            self._counted = True
            self.core.stats.hedge(reason)

    def next_ask(self) -> float:
        """Seconds to wait before the next ask for the hedge: the delay first, then
        twice the last wait each time, at most ``MAX_ASK_INTERVAL`` (or the delay).
        Called only by the race's one waiter (a task, or the caller's thread)."""
        delay = self.delay
        assert delay is not None, "a call with no delay is not raced"
        wait = delay * 2.0 ** min(self._asks, 32)
        self._asks += 1
        return min(wait, max(delay, MAX_ASK_INTERVAL))

    def may_hedge_later(self) -> bool:
        """After ``send_hedge`` sent none: whether to ask again after ``next_ask`` (the
        budget or the endpoints held it back, and the primary still waits)."""
        with self._lock:
            return self._held_back and self.hedge is None and not self._over()

    def ended(self, racer: Racer, result: Any = None, error: BaseException | None = None) -> bool:
        """``racer``'s flow returned ``result`` or raised ``error``; True when it won
        (the other racer is to be cancelled at once)."""
        with self._lock:
            racer.done = True
            if error is None and self.winner is None:
                self.winner = racer
                racer.result = result
                return True
            racer.result, racer.error = result, error
            return False

    def abandon_running(self) -> list[Racer]:
        """The racers still running, now abandoned: the loser once the race is over
        (both, when the caller left before)."""
        with self._lock:
            running = [r for r in (self.primary, self.hedge) if r is not None and not r.done]
            for racer in running:
                racer.abandoned = True
            return running

    def loser_result(self) -> Any:
        """What a loser that answered too (a near tie) holds open, to be closed: a
        stream or a response (None: nothing)."""
        for racer in (self.primary, self.hedge):
            if racer is not None and racer is not self.winner and racer.done:
                result, racer.result = racer.result, None
                if racer.error is None and result is not None:
                    return result
        return None

    def finish(self) -> Any:
        """Once both racers have ended (the loser cancelled): the call's answer, or its
        error raised, with every attempt of both racers in its history."""
        winner, primary, hedge = self.winner, self.primary, self.hedge
        if winner is not None:
            for racer in (primary, hedge):
                if racer is not None:
                    racer.error = None  # its traceback holds the racer's frame: a cycle
            if winner is hedge:
                self.core.stats.hedge(HEDGE_WON)
            self.core.hedging.observe(
                winner.call.spec.model, self.core.clock.now() - self.started, self.policy
            )
            result = winner.result
            if hedge is not None:
                loser = primary if winner is hedge else hedge
                history = _merged(winner.call, loser.call)
                info = info_of(result)
                if info is not None:
                    info.attempt_history = history
            self._decide_traces()
            return result
        error = primary.error
        assert error is not None, "a race without a winner ended in the primary's error"
        # The errors' tracebacks hold the racers' frames, which hold this race.
        primary.error = None
        if hedge is not None:
            hedge.error = None
        if hedge is not None and isinstance(error, StormguardError):
            error.attempt_history = _merged(primary.call, hedge.call)
            error.attempts = primary.call.total_attempts
        self._decide_traces()
        try:
            raise error
        finally:
            del error  # this frame is in its traceback: a cycle

    def abandoned(self) -> None:
        """The race ended without ``finish`` (the caller cancelled the call): the call's
        own end, held while it was undecided, is reported."""
        self._decide_traces()

    def _decide_traces(self) -> None:
        hedge = self.hedge
        trace = None if hedge is None else hedge.call._trace
        decided = getattr(trace, "decided", None)
        if decided is not None:
            won = self.winner is not None and self.winner is hedge
            attempts = (self.winner or self.primary).call.total_attempts
            decided(won, attempts)

    def observe_unhedged(self) -> None:
        """A call with too few latencies known to hedge answered: one more latency."""
        self.core.hedging.observe(
            self.primary.call.spec.model, self.core.clock.now() - self.started, self.policy
        )


def _merged(winner: LogicalCall, loser: LogicalCall) -> tuple[AttemptRecord, ...]:
    """Both racers' records in the order they were sent, the loser's cancelled attempt
    marked ``hedge_lost``; the winner's call keeps them (a stream's later error)."""
    lost = tuple(
        replace(record, outcome=HEDGE_LOST) if record.outcome == StopReason.CANCELLED else record
        for record in loser.history
    )
    history = tuple(sorted(winner.history + lost, key=lambda record: record.started_at or 0.0))
    winner.history = history
    winner.total_attempts += loser.total_attempts
    return history


def info_of(result: object) -> CallInfo | None:
    """The ``CallInfo`` a call's answer carries (a record, a stream, a response in
    transport mode, a hand-over's ``Delivery``)."""
    if isinstance(result, (APIResult, _StreamBase)):
        return result.call_info
    if isinstance(result, Delivery):
        return result.info
    if isinstance(result, response_types()):
        info = result.extensions.get(CALL_INFO_EXTENSION)
        return info if isinstance(info, CallInfo) else None
    return None
