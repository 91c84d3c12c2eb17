"""The call's side of its key's quota: ``QuotaGate`` (one per client, shared by its
``with_options`` copies) names a call's key and finds its quota; ``CallQuota`` is
one call's place in it: its ticket, what it waited, the cost it holds.

A call's **key** is its credential (the ``Authorization`` bearer token, Azure's
``api-key``, Anthropic's ``x-api-key``: the call's own header before the
client's), the service's host and the model: OpenAI's limits are per key and
model, and the same key on two services is two quotas. Without a credential, the
host stands for the key. Only the credential's fingerprint is kept.

A call's **cost** is what the provider charges when it admits it: the prompt's
tokens (the token pre-check's count when one ran, else the body's bytes / 4)
plus ``max_tokens`` (``max_completion_tokens``, ``max_output_tokens``; else the
pre-check's default, else ``QuotaPolicy.default_output_tokens``; none for
embeddings), and one request. The bytes / 4 estimate is corrected per key by
what the provider counted (``QuotaGate.calibrate``): each answer's
``usage.prompt_tokens`` and each 429's "Requested N". A JSON body weighs more than
its prompt (keys, quotes, the model's name), and a pacer that counts each call ~10 %
heavier than the provider does sends ~10 % slower than the key allows.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import math
import os
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..._core import logs as _logs
from ..._core.rate_limit_headers import RateLimit
from ._config import QuotaPolicy, check_redis_url
from ._key import Grant, Pace, QuotaKey, QuotaSnapshot
from ._key_state import KeyState
from ._registry import fingerprint, registry_for
from ._shared import SharedAsk
from ._signals import readings, refusal_of

if TYPE_CHECKING:
    from ..._core.clock import Clock
    from ._bucket import Reply

__all__ = [
    "CREDENTIAL_HEADERS",
    "REDIS_ENV",
    "CallQuota",
    "QuotaGate",
    "estimate_cost",
    "output_tokens",
    "prompt_estimate",
]

#: The Redis URL a ``QuotaPolicy`` without ``redis_url`` shares its keys in (as
#: botocore reads ``AWS_RETRY_MODE``): a fleet turns sharing on without a code change.
REDIS_ENV = "STORMGUARD_QUOTA_REDIS"

#: The headers that carry a credential, in the order they are read.
CREDENTIAL_HEADERS = ("authorization", "api-key", "x-api-key")
#: Bytes of a JSON body per prompt token, for a call no pre-check counted (English
#: runs near 4 characters a token; the body's keys and quotes add a little).
_BYTES_PER_TOKEN = 4.0
_OUTPUT_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
_MAX_NAMED = 1024
#: How far one answer moves a key's prompt scale toward what it measured, and the
#: scale's bounds (a provider's count is never 4 times off the body's bytes / 4).
_SCALE_STEP = 0.3
_SCALE_BOUNDS = (0.25, 4.0)


def estimate_cost(
    body: Mapping[str, Any] | None,
    content: bytes | None,
    *,
    embeddings: bool,
    default_output: int,
    precheck: tuple[int, int] | None = None,
    prompt_scale: float = 1.0,
) -> float:
    """The tokens a provider charges a call when it admits it (module doc).
    ``precheck``: the pre-check's (prompt tokens, max_tokens); ``prompt_scale``: the
    key's correction of the bytes / 4 estimate (``QuotaGate.prompt_scale``)."""
    if precheck is not None:
        return float(precheck[0] + (0 if embeddings else precheck[1]))
    prompt = prompt_scale * prompt_estimate(content)
    if embeddings:
        return max(prompt, 1.0)
    return max(prompt + output_tokens(body, default_output), 1.0)


def prompt_estimate(content: bytes | None) -> float:
    """A body's prompt tokens as its bytes / 4, before any key's correction."""
    return len(content) / _BYTES_PER_TOKEN if content else 0.0


def output_tokens(body: Mapping[str, Any] | None, default_output: int) -> int:
    """The output a provider charges at admission: the body's ``max_tokens`` (or its
    newer names), else ``default_output``."""
    if body is not None:
        for name in _OUTPUT_FIELDS:
            value = body.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                return value
    return default_output


class QuotaGate:
    """A client's way to the quotas of its keys (module doc)."""

    def __init__(self, policy: QuotaPolicy, clock: Clock) -> None:
        policy = with_redis_from_env(policy)
        self.policy = policy
        self.now = clock.now
        self.registry = registry_for(policy, clock, clock.now)
        #: Keys are shared (Redis, this machine's files): a key's state is made at its
        #: first call that finds something in the store (``QuotaRegistry.shared_known``).
        self.shared = self.registry.store is not None
        self._seq = itertools.count()
        self._named: dict[tuple[str | None, str, str], QuotaKey] = {}
        #: The keys this client's calls used, for ``stats()`` (bounded as the registry).
        self._used: OrderedDict[QuotaKey, None] = OrderedDict()
        #: Per key, the provider's prompt tokens over the bytes / 4 estimate (module
        #: doc); at most ``max_keys``. Read and written without a lock: a race loses
        #: one answer's step, which the next answer makes again.
        self._scales: dict[QuotaKey, float] = {}

    def key_for(self, credential: str | None, host: str, model: str) -> QuotaKey:
        """The key of a call sending ``credential`` to ``host`` for ``model``."""
        named = (credential, host, model)
        key = self._named.get(named)
        if key is None:
            if len(self._named) >= _MAX_NAMED:
                self._named.clear()
            secret = _secret(credential)
            keyed = secret is not None
            key = QuotaKey(fingerprint(secret if keyed else f"host:{host}"), host, model, keyed)
            self._named[named] = key
        return key

    def call(self, key: QuotaKey, rank: int) -> CallQuota:
        """One call's place in ``key``'s quota, behind the calls made before it."""
        return CallQuota(self, key, (rank, next(self._seq)))

    def prompt_scale(self, key: QuotaKey) -> float:
        """What the bytes / 4 estimate of ``key``'s prompts is multiplied by."""
        return self._scales.get(key, 1.0)

    def calibrate(self, key: QuotaKey, estimated: float, counted: float) -> None:
        """The provider counted ``counted`` prompt tokens where the bytes / 4 estimate
        said ``estimated``: move the key's scale a step toward their ratio."""
        if not (0 < estimated < math.inf and 0 < counted < math.inf):
            return
        low, high = _SCALE_BOUNDS
        ratio = min(high, max(low, counted / estimated))
        old = self._scales.pop(key, None)
        if old is None and len(self._scales) >= self.policy.max_keys:
            with contextlib.suppress(StopIteration, KeyError):  # another thread's pop
                del self._scales[next(iter(self._scales))]  # the least recently measured
        self._scales[key] = ratio if old is None else old + _SCALE_STEP * (ratio - old)

    def used(self, key: QuotaKey) -> None:
        if key not in self._used:
            self._used[key] = None
            while len(self._used) > self.policy.max_keys:
                self._used.popitem(last=False)

    def snapshot(self) -> tuple[QuotaSnapshot, ...]:
        """Each key this client used whose quota is paced: ``client.stats().quota``."""
        now, found = self.now(), []
        for key in list(self._used):
            for state in self.registry.snapshot((key,), now):
                if isinstance(state, QuotaSnapshot):
                    found.append(replace(state, prompt_scale=self.prompt_scale(key)))
        return tuple(found)


def with_redis_from_env(policy: QuotaPolicy) -> QuotaPolicy:
    """``policy`` with ``$STORMGUARD_QUOTA_REDIS`` as its ``redis_url`` when it sets
    none; and a clear ``ImportError`` when a URL is set without the redis package."""
    if policy.redis_url is None:
        url = os.environ.get(REDIS_ENV, "").strip()
        if not url:
            return policy
        try:
            check_redis_url(url)
        except ValueError:
            raise ValueError(f"${REDIS_ENV} must be a redis://, rediss:// or unix:// URL") from None
        policy = replace(policy, redis_url=url)
    if importlib.util.find_spec("redis") is None:
        raise ImportError(
            "QuotaPolicy(redis_url=...) needs the redis package: pip install 'stormguard[redis]'"
        )
    return policy


def _secret(credential: str | None) -> str | None:
    """The secret of a credential header (``Bearer sk-...`` reads as ``sk-...``)."""
    if not credential:
        return None
    scheme, _, rest = credential.strip().partition(" ")
    secret = rest.strip() if scheme.lower() == "bearer" and rest else credential.strip()
    return secret or None


class CallQuota:
    """One call's place in its key's quota (used by one call's driver at a time)."""

    __slots__ = (
        "_grant",
        "_granted",
        "_state",
        "_waiting",
        "attempt_wait",
        "gate",
        "key",
        "paced",
        "ticket",
        "wait_s",
    )

    def __init__(self, gate: QuotaGate, key: QuotaKey, ticket: tuple[int, int]) -> None:
        self.gate = gate
        self.key = key
        self.ticket = ticket
        self._state: KeyState | None = None
        #: The cost granted and not yet sent (refunded if the attempt never goes).
        self._granted = 0.0
        #: What a shared bucket's reservation took for the current attempt (None: the
        #: local state's, or nothing).
        self._grant: Grant | None = None
        self._waiting = False
        #: Seconds waited for the quota: over the call, and before the current attempt.
        self.wait_s = 0.0
        self.attempt_wait = 0.0
        #: Quota 429s this call went back to the pacer for.
        self.paced = 0

    def state(self) -> KeyState | None:
        """The key's quota once a signal turned it on (None: nothing to pace)."""
        if self._state is None:
            self._state = self.gate.registry.get(self.key)
        return self._state

    def pace(self, cost: float, now: float, deadline: float) -> Pace | SharedAsk | None:
        """Ask for the call's share before an attempt: None, go now; a ``SharedAsk``,
        do its I/O and hand its answer to ``answered``; else sleep ``seconds`` and then
        send (``granted``) or ask again. Raises ``QuotaWaitError`` when the deadline
        cannot be met."""
        state = self.state()
        if state is None:
            return None
        self._grant = None
        try:
            pace = state.reserve(self.ticket, cost, now, deadline, self.attempt_wait)
        except BaseException:
            self._waiting = False
            raise
        if isinstance(pace, SharedAsk):
            return pace
        return self._paced(pace, cost)

    def answered(self, ask: SharedAsk, reply: Reply | BaseException, now: float) -> Pace | None:
        """The answer to the ``SharedAsk`` ``pace`` returned: as ``pace``'s."""
        try:
            pace = ask.state.answered(ask, reply, now)
        except BaseException:
            self._waiting = False
            raise
        self._grant = ask.grant
        return self._paced(pace, ask.cost)

    def _paced(self, pace: Pace, cost: float) -> Pace | None:
        self._waiting = not pace.granted
        if pace.granted:
            self._granted = cost
        self.wait_s += pace.seconds
        self.attempt_wait += pace.seconds
        if pace.first_wait:
            _logs.quota_waiting(key=self.key.fingerprint, model=self.key.model, wait=pace.seconds)
        if pace.granted and pace.seconds <= 0:
            return None
        return pace

    def sent(self) -> None:
        """The attempt went out: what it was granted is spent."""
        self._granted = 0.0
        if self._state is not None:
            self.gate.used(self.key)

    def leave(self) -> None:
        """The call stopped waiting, or its granted attempt was never sent."""
        state, granted, waiting = self._state, self._granted, self._waiting
        self._granted, self._waiting = 0.0, False
        if state is None:
            return
        if waiting:
            state.withdraw(self.ticket)
        if granted:
            state.refund(granted, self._grant)

    def observe(self, t_send: float, now: float, rate_limit: RateLimit, admitted: float) -> None:
        """A response's ``x-ratelimit-*`` headers (``admitted``: the call's cost when
        the provider charged it, else 0); the first turns the key's pacing on. An
        answer without them, once a 429 has turned it on, still counts the call among
        this process's sends: its share of the key is measured between its 429s from
        them."""
        found = readings(rate_limit)
        if found == (None, None):
            state = self.state()
            if state is not None and admitted > 0:
                state.observe(t_send, now, found, admitted)
            return
        state = self._state
        if state is None:
            state = self._state = self.gate.registry.activate(self.key)
        else:
            self.gate.registry.touch(self.key)
        self.gate.used(self.key)
        for dimension, limit in state.observe(t_send, now, found, admitted):
            _logs.quota_learned(
                key=self.key.fingerprint, model=self.key.model, dimension=dimension, limit=limit
            )

    def charged(self, tokens: float, requests: float = 1.0) -> None:
        """The provider answered the attempt and charged it ``tokens`` and ``requests``
        (0, 0: nothing, as for a 4xx other than a quota 429): a shared bucket trues up
        what it took for it."""
        state = self._state
        if state is not None:
            state.charged(self._grant, tokens, requests)

    def refused(
        self,
        t_send: float,
        now: float,
        message: str | None,
        retry_after: float | None,
        rate_limit: RateLimit,
    ) -> float:
        """A quota 429: the key's pacing turns on (if it was not), and no call of the
        key goes before its wait. Returns that wait, jittered (seconds)."""
        refusal = refusal_of(message)
        wait = retry_after
        if wait is None:
            wait = refusal.retry_in
        if wait is None:
            wait = rate_limit.exhausted_reset()
        state = self._state or self.gate.registry.activate(self.key)
        self._state = state
        self.gate.used(self.key)
        self.paced += 1
        had_headers = readings(rate_limit) != (None, None)
        return state.refused(t_send, now, refusal, wait, had_headers, self._grant)

    def least_wait(self, cost: float, now: float) -> float:
        state = self.state()
        return 0.0 if state is None else state.least_wait(now, cost)
