"""State changes handed to listeners in order, outside the lock that made them.

The breaker and the ejection tracker change state under a lock and must tell
listeners (telemetry, the user's hooks) without holding it: a listener may be
slow or call back in. Changes are queued under the owner's lock (``put``) and
delivered after it is released (``deliver``): one thread delivers at a time, and
a change queued meanwhile (by another thread, or by a listener calling back in)
is delivered by it. A listener that raises is logged and the others still run.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["Outbox"]

T = TypeVar("T")


class Outbox(Generic[T]):
    """Pending changes of one owner, sharing the owner's ``lock``."""

    __slots__ = ("_delivering", "_describe", "_listeners", "_lock", "_logger", "_pending")

    def __init__(
        self,
        lock: threading.Lock,
        listeners: Sequence[Callable[[T], None]],
        describe: Callable[[T], str],
        logger: logging.Logger,
    ) -> None:
        self._lock = lock
        self._listeners = tuple(listeners)
        #: The text a failing listener's log line names the change by.
        self._describe = describe
        #: The owner's logger: a failing listener is logged where the owner logs.
        self._logger = logger
        self._pending: deque[T] = deque()
        self._delivering = False

    @property
    def listening(self) -> bool:
        """Whether anyone listens (a change need not be built otherwise)."""
        return bool(self._listeners)

    def put(self, change: T) -> None:
        """Queue a change (the caller holds the lock)."""
        self._pending.append(change)

    def deliver(self) -> None:
        """Hand every queued change to the listeners, in order (without the lock)."""
        if not self._pending:
            # Nothing queued (every call but a state change): no lock taken. A change
            # queued meanwhile is delivered by the one that queued it.
            return
        while True:
            with self._lock:
                if self._delivering or not self._pending:
                    return
                self._delivering = True
                batch = tuple(self._pending)
                self._pending.clear()
            try:
                for change in batch:
                    for listener in self._listeners:
                        try:
                            listener(change)
                        except Exception:
                            self._logger.exception(
                                "%s: listener %r failed", self._describe(change), listener
                            )
            finally:
                with self._lock:
                    self._delivering = False
