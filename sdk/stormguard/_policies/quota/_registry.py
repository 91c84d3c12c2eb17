"""``QuotaRegistry``: the keys whose quota this process paces to, shared by every
client on the same key, bounded, least recently used first out.

A key's quota is the provider's, not a client's: two clients (or ``with_options``
copies) on one key must pace together, or each would spend what the other does.
So the registry is process-wide, one per clock and ``QuotaPolicy`` (two clients
with equal policies on the system clock share it; a test's ``FakeClock`` has its
own, so tests do not share pacing). A key enters it on its first quota signal
(``activate``); until then a call of the key finds nothing and pays a dict look-up,
and its answer, when it carried no headers, a tally of what it cost (``unpaced``):
the first 429 of a provider without headers starts from it.

Keys are kept by fingerprint: the first 12 hex digits of the credential's SHA-256
(the label the reference server gives a key in its metrics and 429s), never the
credential.

With ``QuotaPolicy.redis_url`` the registry holds one ``RedisStore`` (the server's
connections and health) and a ``SharedKeyQuota`` per key, made at the key's first
call rather than its first signal: another process may have learned the key's limit.
Without one, the registry of the system clock holds a ``HostStore`` (this machine's
quota files; ``QuotaPolicy.share_on_host``), and a key's ``SharedKeyQuota`` is made
at its first signal, or at the first call that finds the key's file.
"""

from __future__ import annotations

import functools
import hashlib
import random
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from ..._core.fork import fork_safe_lock
from ._config import QuotaPolicy
from ._key import KeyQuota, QuotaKey
from ._key_state import KeyState
from ._shared import SharedKeyQuota, shared_name
from ._tally import SendTally

if TYPE_CHECKING:
    from ._store import QuotaStore

__all__ = ["QuotaRegistry", "fingerprint", "registry_for"]


@functools.lru_cache(maxsize=1024)
def fingerprint(secret: str) -> str:
    """The first 12 hex digits of ``secret``'s SHA-256: a key's name, never the key.

    >>> fingerprint("sk-my-key")
    '322ad2605eaf'
    """
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()[:12]


class QuotaRegistry:
    """One ``KeyQuota`` (or ``SharedKeyQuota``) per (key, host, model) in use, at most
    ``policy.max_keys`` (plus any a call waits on beyond it), the least recently used
    dropped first."""

    def __init__(
        self, policy: QuotaPolicy, *, rng: random.Random | None = None, host: bool = False
    ) -> None:
        self.policy = policy
        self._rng = rng
        self._lock = fork_safe_lock()
        self._states: OrderedDict[QuotaKey, KeyState] = OrderedDict()
        #: What this process sent to each key not paced yet, for a 429 to come.
        self._tallies: OrderedDict[QuotaKey, SendTally] = OrderedDict()
        #: Where the keys are shared (None: each process paces alone): a Redis, else,
        #: on the system clock (``host``), this machine's quota files.
        self.store: QuotaStore | None = None
        if policy.redis_url is not None:
            from ._redis import RedisStore

            self.store = RedisStore(policy.redis_url, policy.redis_timeout, rng=rng)
        elif host and policy.share_on_host:
            from ._host_store import HostStore, host_directory

            directory = host_directory()
            if directory is not None:
                self.store = HostStore(directory, rng=rng)
        #: Keys dropped to make room.
        self.evicted = 0

    def get(self, key: QuotaKey) -> KeyState | None:
        """The key's quota, if a signal has turned it on (a dict look-up, no lock)."""
        return self._states.get(key)

    def activate(self, key: QuotaKey) -> KeyState:
        """The key's quota, made on its first quota signal; the least recently used
        with no waiter goes past ``max_keys``."""
        with self._lock:
            found = self._states.get(key)
            if found is not None:
                self._states.move_to_end(key)
                return found
            state: KeyState
            tally = self._tallies.pop(key, None)
            if self.store is not None:
                state = SharedKeyQuota(key, self.policy, self.store, self._rng, tally)
            else:
                state = KeyQuota(key, self.policy, self._rng, tally)
            self._states[key] = state
            if len(self._states) > self.policy.max_keys:
                for old, candidate in list(self._states.items()):
                    if len(self._states) <= self.policy.max_keys:
                        break
                    if old != key and not candidate.active:
                        del self._states[old]
                        self.evicted += 1
            return state

    def shared_known(self, key: QuotaKey) -> bool:
        """Whether a key this process does not pace yet is to ask its shared bucket:
        always in Redis; on this machine, once its file exists (another process
        learned something of it)."""
        store = self.store
        return store is not None and store.known(shared_name(key))

    def unpaced(self, key: QuotaKey, t_send: float, now: float, cost: float) -> None:
        """A call that was not paced was answered, charged ``cost``, without headers: it
        counts in what this process sent to ``key`` (``SendTally``), or, when a 429 has
        turned the key's pacing on since the call went, in its share."""
        state = self._states.get(key)
        if state is not None:
            state.observe(t_send, now, (None, None), cost)
            return
        tally = self._tallies.get(key)
        if tally is None:
            with self._lock:
                tally = self._tallies.get(key)
                if tally is None:
                    tally = self._tallies[key] = SendTally()
                    while len(self._tallies) > self.policy.max_keys:
                        self._tallies.popitem(last=False)
        tally.add(t_send, cost)

    def touch(self, key: QuotaKey) -> None:
        """The key was used: it goes last out."""
        with self._lock:
            if key in self._states:
                self._states.move_to_end(key)

    def snapshot(self, keys: Iterable[QuotaKey], now: float) -> tuple[object, ...]:
        """The ``QuotaSnapshot`` of each of ``keys`` still kept."""
        with self._lock:
            states = [self._states[k] for k in keys if k in self._states]
        return tuple(state.snapshot(now) for state in states)

    def __len__(self) -> int:
        return len(self._states)


_system: dict[QuotaPolicy, QuotaRegistry] = {}
_by_clock: weakref.WeakKeyDictionary[object, dict[QuotaPolicy, QuotaRegistry]] = (
    weakref.WeakKeyDictionary()
)
_registries_lock = fork_safe_lock()


def registry_for(policy: QuotaPolicy, clock: object, now: Callable[[], float]) -> QuotaRegistry:
    """The process's registry for ``policy`` on ``clock`` (whose time is ``now``):
    one for every client reading the system's monotonic clock, one per other clock."""
    with _registries_lock:
        table = _system if now is time.monotonic else _by_clock.setdefault(clock, {})
        registry = table.get(policy)
        if registry is None:
            registry = table[policy] = QuotaRegistry(policy, host=table is _system)
        return registry
