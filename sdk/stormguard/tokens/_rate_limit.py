"""A client-side token rate limit: a token bucket on prompt + max_tokens, refunded on usage."""

from __future__ import annotations

import math

from .._core.clock import ClockLike, ClockRef
from .._core.exceptions import TokenRateLimitedError
from .._core.fork import fork_safe_lock
from .._policies.limiter.aimd import MAX_PAUSE_S

__all__ = ["MAX_RESET_WAIT_S", "MAX_SETTLE_FACTOR", "Reservation", "TokenRateLimiter"]

#: A usage is counted up to this many times its reservation (prompt + max_tokens).
MAX_SETTLE_FACTOR = 2.0
#: The longest a server's reset (``observe``) holds reservations back: an endpoint's
#: longest pause, the one bound on how long a server's word can hold calls.
MAX_RESET_WAIT_S = MAX_PAUSE_S


class TokenRateLimiter:
    """Tokens per minute for this process, shared by threads and asyncio tasks.

    A bucket of ``burst`` tokens (default: one minute's worth) refills at
    ``tokens_per_minute / 60`` per second. :meth:`reserve` takes the tokens at once
    and says how long the caller must wait before sending; the level may go below
    zero, so later callers queue behind earlier ones in arrival order (the scheme
    of Go's ``rate.Limiter.ReserveN``). It never sleeps, so it is safe to call from
    an event loop: the caller sleeps ``reservation.wait`` with ``time.sleep`` or
    ``asyncio.sleep``.

    Hand-written because the common limiters (aiolimiter, pyrate-limiter, limits)
    either sleep themselves or cannot refund a part of a reservation once the real
    usage is known.

        limiter = TokenRateLimiter(tokens_per_minute=90_000)
        reservation = limiter.reserve(prompt_tokens + max_tokens, max_wait=remaining)
        time.sleep(reservation.wait)
        ...  # send the request
        reservation.settle(response.usage.total_tokens)
    """

    def __init__(
        self,
        tokens_per_minute: float,
        burst: float | None = None,
        clock: ClockLike | None = None,
    ) -> None:
        if not tokens_per_minute > 0 or math.isinf(tokens_per_minute):
            raise ValueError("tokens_per_minute must be a positive finite number")
        self.tokens_per_minute = tokens_per_minute
        self.burst = float(burst if burst is not None else tokens_per_minute)
        if not self.burst > 0:
            raise ValueError("burst must be positive")
        self._rate = tokens_per_minute / 60.0  # tokens per second
        self._clock = ClockRef(clock)
        self._level = self.burst
        self._updated = self._clock.now()
        #: No reservation may be sent before this moment (the server's reset).
        self._not_before = -math.inf
        self._lock = fork_safe_lock()

    def adopt_clock(self, clock: ClockLike) -> None:
        """Read ``clock`` (a client's) unless this limiter was given one of its own."""
        with self._lock:
            if self._clock.adopt(clock):
                self._updated = self._clock.now()

    def reserve(self, tokens: int, max_wait: float | None = None) -> Reservation:
        """Take ``tokens`` now; raise :class:`TokenRateLimitedError` if the wait is too long.

        ``max_wait`` is what the call can still wait (its remaining deadline; None: no
        limit). A request larger than ``burst`` can never fit and is refused at once.
        """
        if tokens < 0:
            raise ValueError("tokens must be >= 0")
        if tokens > self.burst:
            raise TokenRateLimitedError(
                f"{tokens} tokens can never fit the client token rate limit "
                f"(burst {self.burst:g} at {self.tokens_per_minute:g} tokens/min)",
                tokens=tokens,
                wait=math.inf,
            )
        with self._lock:
            self._refill()
            wait = max(0.0, (tokens - self._level) / self._rate, self._not_before - self._updated)
            if max_wait is not None and wait > max_wait:
                raise TokenRateLimitedError(
                    f"{tokens} tokens would wait {wait:.3f}s for the client token rate limit "
                    f"({self.tokens_per_minute:g} tokens/min), "
                    f"longer than the {max_wait:.3f}s the call has left",
                    tokens=tokens,
                    wait=wait,
                )
            self._level -= tokens
        return Reservation(self, tokens, wait)

    def observe(self, remaining: int, reset: float | None) -> None:
        """What the server says is left of this caller's tokens (``x-ratelimit-
        remaining-tokens``) and when its window is whole again (``-reset-tokens``,
        seconds). The bucket holds no more than the server has left; with nothing
        left, no reservation is sent before the reset, or before
        ``MAX_RESET_WAIT_S`` (60 s) when the reset is further off. The server's
        count covers every process on the same key, which the local bucket cannot
        see. A count can empty the bucket, never take it below empty: one answer
        costs later calls at most one burst's refill (60 s at the default burst),
        and calls still go at ``tokens_per_minute``."""
        if remaining < 0:
            return
        with self._lock:
            self._refill()
            self._level = min(self._level, float(remaining))
            if remaining == 0 and reset is not None and math.isfinite(reset) and reset > 0:
                wait = min(reset, MAX_RESET_WAIT_S)
                self._not_before = max(self._not_before, self._updated + wait)

    @property
    def available(self) -> float:
        """Tokens in the bucket now (negative while reservations are queued)."""
        with self._lock:
            self._refill()
            return self._level

    def _refund(self, tokens: float) -> None:
        with self._lock:
            self._refill()
            self._level = min(self.burst, self._level + tokens)

    def _refill(self) -> None:
        now = self._clock.now()
        elapsed = max(0.0, now - self._updated)  # a clock that steps back refills nothing
        self._updated = now
        self._level = min(self.burst, self._level + elapsed * self._rate)

    def __repr__(self) -> str:
        return f"TokenRateLimiter({self.tokens_per_minute:g}/min, burst={self.burst:g})"


class Reservation:
    """Tokens taken from a :class:`TokenRateLimiter`; ``wait`` is the caller's sleep."""

    def __init__(self, limiter: TokenRateLimiter, tokens: int, wait: float) -> None:
        self.tokens = tokens
        self.wait = wait
        self._limiter = limiter
        self._done = False
        self._lock = fork_safe_lock()

    def settle(self, actual_tokens: int) -> None:
        """Correct the reservation to the real usage: refund the unused part, or take
        more, up to ``MAX_SETTLE_FACTOR`` (2) times the reservation in all.

        The reservation is the prompt plus ``max_tokens``, past which the server does
        not generate: a usage beyond it comes from a prompt counted short, by a
        fraction, and one beyond twice it is not a usage this request could have had
        (``10**15`` believed would hold every later call back for centuries). A
        request that sets no ``max_tokens`` is reserved with the pre-check's default,
        a guess: set it for an exact cost. Only the first ``settle`` or ``cancel``
        counts; later ones do nothing.
        """
        if self._finish():
            used = min(max(0, actual_tokens), MAX_SETTLE_FACTOR * self.tokens)
            self._limiter._refund(self.tokens - used)

    def cancel(self) -> None:
        """Give every token back (the request was not sent, or used nothing)."""
        if self._finish():
            self._limiter._refund(self.tokens)

    def _finish(self) -> bool:
        with self._lock:
            first, self._done = not self._done, True
            return first

    def __repr__(self) -> str:
        return f"Reservation(tokens={self.tokens}, wait={self.wait:.3f})"
