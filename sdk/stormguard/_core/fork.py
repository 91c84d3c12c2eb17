"""What a process forked from this one gets back of the SDK's shared state.

A child made by ``os.fork()`` (gunicorn ``--preload``, ``multiprocessing`` with
the fork start method) starts with a copy of the parent's memory and one thread:
the one that forked. Two things in that copy would hurt it:

- a ``threading.Lock`` another thread of the parent held at that instant stays
  held for good, since the thread that would release it does not exist in the
  child: the child's first call that takes it would hang. The locks of the
  SDK's policies (limiter, breakers, budget, throttle, stats, ...) are made by
  :func:`fork_safe_lock`, and a child gets each back unheld, as CPython's own
  ``logging`` and ``concurrent.futures`` do for theirs (``_at_fork_reinit``,
  from ``os.register_at_fork``). What such a lock guarded may be half-updated:
  the policies hold their locks for a few counters at a time, so a count may be
  off by one call, never a structure torn.
- counts of the parent's calls in flight, such as the concurrency slots they hold,
  which nothing in the child will ever give back: an object that keeps such
  counts registers with :func:`forget_in_child`, and its ``_forget_parent_calls``
  runs in the child, after the locks are back.

The connection pools are not here: a pool notices for itself that it runs in
another process (``_io/pool_life.py``), as redis-py's ``ConnectionPool`` does, by
comparing :data:`forks` with its own: a counter read, where ``os.getpid()`` is a
system call on each request.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Protocol

__all__ = ["ForgetsParentCalls", "forget_in_child", "fork_safe_lock", "forks"]

#: How many forks this process is from: one more in each child (by
#: ``os.register_at_fork``, which ``os.fork()`` and ``multiprocessing`` run).
forks = 0


class ForgetsParentCalls(Protocol):
    def _forget_parent_calls(self) -> None:
        """In a forked child: drop what the parent's calls in flight hold."""


_locks: weakref.WeakSet[threading.Lock] = weakref.WeakSet()
_forgetful: weakref.WeakSet[ForgetsParentCalls] = weakref.WeakSet()


def fork_safe_lock() -> threading.Lock:
    """A ``threading.Lock`` that a forked child gets back unheld (module doc)."""
    lock = threading.Lock()
    _locks.add(lock)
    return lock


def forget_in_child(owner: ForgetsParentCalls) -> None:
    """Have ``owner._forget_parent_calls()`` run in every child forked from now on
    (for as long as ``owner`` lives)."""
    _forgetful.add(owner)


def _in_child() -> None:
    global forks
    forks += 1
    for lock in list(_locks):
        reinit = getattr(lock, "_at_fork_reinit", None)  # CPython 3.9+, as logging uses it
        if reinit is not None:
            reinit()
    for owner in list(_forgetful):
        owner._forget_parent_calls()


if hasattr(os, "register_at_fork"):  # POSIX; elsewhere there is no fork
    os.register_at_fork(after_in_child=_in_child)
