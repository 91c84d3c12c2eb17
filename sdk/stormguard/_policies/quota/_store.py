"""``QuotaStore``: where a key's shared bucket lives (Redis: ``_redis.py``; files on this
machine: ``_host_store.py``), and the health both share.

A store runs one reservation per attempt (``run_sync``/``run_async``: the bucket step,
``_bucket.py``'s or the Lua script's, on the key's fields; its reply, or the error that
stood for it, never raised). When it fails (an error, a timeout, a reply of another
shape), calls pace locally at once, one WARNING says so, and the store is asked again
after a back-off (1 s, doubling to 30 s, jittered), by one call at a time; when it
answers, an INFO line says so and the keys go back to it.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, ClassVar

from ..._core import logs as _logs
from ..._core.fork import fork_safe_lock

if TYPE_CHECKING:
    from ._bucket import Reply

__all__ = ["BACKOFF_S", "QuotaStore"]

#: The back-off before a failed store is asked again: first, most (seconds).
BACKOFF_S = (1.0, 30.0)


class QuotaStore:
    """A shared bucket's store and its health (module doc). Thread-safe."""

    #: What ``stats().quota[i].backend`` says of a key while its store answers.
    backend: ClassVar[str]
    #: The store's clock less this process's, when known before any reply (0: the
    #: same clock); None: learned from the first reply.
    offset: ClassVar[float | None] = None

    def __init__(self, timeout: float, what: str, *, rng: random.Random | None = None) -> None:
        #: The most seconds one reservation may take; a call with less left paces alone.
        self.timeout = timeout
        #: The store in a log line ("the Redis at host:port"): never a password.
        self.what = what
        self._rng = rng or random.Random()
        self._health_lock = fork_safe_lock()
        #: Down: calls pace locally until ``_retry_at``; then one call asks again.
        self.down = False
        self._retry_at = 0.0
        self._backoff = BACKOFF_S[0]
        #: Failures seen (for stats and tests).
        self.failures = 0

    def known(self, name: str) -> bool:
        """Whether the bucket ``name`` may hold a limit: a call of a key not paced in
        this process asks the store only then."""
        return True

    def run_sync(self, name: str, args: tuple[object, ...]) -> Reply | BaseException:
        raise NotImplementedError

    async def run_async(self, name: str, args: tuple[object, ...]) -> Reply | BaseException:
        raise NotImplementedError

    def describe(self, error: BaseException) -> str:
        """``error`` for a log line: its class and message, short."""
        return f"{type(error).__name__}: {error}"[:200]

    # -- health ------------------------------------------------------------------

    def usable(self, now: float) -> bool:
        """Whether a call may ask the store now: it is up, or its back-off is over
        (then this call is the one that asks; the next may after one more timeout)."""
        if not self.down:
            return True
        with self._health_lock:
            if now < self._retry_at:
                return False
            self._retry_at = now + self.timeout + 0.05
            return True

    def answered(self) -> None:
        if self.down:
            with self._health_lock:
                was, self.down, self._backoff = self.down, False, BACKOFF_S[0]
            if was:
                _logs.quota_store_back(what=self.what)

    def failed(self, now: float, error: BaseException) -> None:
        with self._health_lock:
            first = not self.down
            self.down = True
            self.failures += 1
            wait = self._backoff * (0.8 + 0.4 * self._rng.random())
            self._retry_at = now + wait
            self._backoff = min(self._backoff * 2, BACKOFF_S[1])
        if first:
            _logs.quota_store_down(what=self.what, error=self.describe(error), retry=wait)
