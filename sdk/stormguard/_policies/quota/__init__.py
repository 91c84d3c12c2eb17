"""Pacing to a hosted API's per-key quota (tokens and requests per minute).

One module per job, each testable alone with an injected clock:

* ``_config``: ``QuotaPolicy``, the knobs and the reason for each default;
* ``_share``: ``ShareController``, one dimension paced to the ``x-ratelimit-*``
  headers by this process's measured share of the key;
* ``_refusal_share``: ``RefusalShare``, the share of the key's refill paced to when
  only 429s read the key (no headers), started from ``_tally``'s ``SendTally``, what
  this process sent before;
* ``_cubic``: ``CubicRate``, a rate learned from 429s whose message says nothing
  (AWS's adaptive mode), and the cap a 429 puts on headers that said there was room;
* ``_pace_bucket``: ``PaceBucket``, the local token bucket sends are paced through;
* ``_signals``: what a response and a 429's message say of the quota;
* ``_key``: ``KeyQuota``, one key's quota under one lock, and the waiting calls;
  ``QuotaKey``, ``Pace``, ``Grant``, ``QuotaSnapshot``, the values the others share;
* ``_shared``: ``SharedKeyQuota``, one key's quota shared by every process on it,
  in Redis (``QuotaPolicy.redis_url``) or this machine's files
  (``QuotaPolicy.share_on_host``), with the local one kept for when the store fails;
* ``_bucket``: the shared bucket's name, reply and step (the Redis script's, in
  Python); ``_store``: ``QuotaStore``, a store's interface and health;
  ``_host_store``: ``HostStore``, the files of this machine's processes;
* ``_key_state``: ``KeyState``, the interface a call uses of either (reserve,
  observe, refused, refund, withdraw);
* ``_redis``: ``RedisStore``, the bucket script, the connections and their health
  (imported only when a Redis URL is set; redis-py is imported at the first call);
* ``_registry``: ``QuotaRegistry``, the keys in use, process-wide and bounded;
* ``_gate``: ``QuotaGate`` and ``CallQuota``, the call's side: its key, its cost,
  its place in line.

docs/quotas.md says what the policy does and why.
"""

from ._config import QuotaPolicy
from ._gate import (
    CREDENTIAL_HEADERS,
    REDIS_ENV,
    CallQuota,
    QuotaGate,
    estimate_cost,
    output_tokens,
    prompt_estimate,
)
from ._key import Grant, KeyQuota, Pace, QuotaKey, QuotaSnapshot
from ._key_state import KeyState
from ._registry import QuotaRegistry, fingerprint, registry_for
from ._shared import SharedAsk, SharedKeyQuota
from ._signals import Refusal, refusal_of

__all__ = [
    "CREDENTIAL_HEADERS",
    "REDIS_ENV",
    "CallQuota",
    "Grant",
    "KeyQuota",
    "KeyState",
    "Pace",
    "QuotaGate",
    "QuotaKey",
    "QuotaPolicy",
    "QuotaRegistry",
    "QuotaSnapshot",
    "Refusal",
    "SharedAsk",
    "SharedKeyQuota",
    "estimate_cost",
    "fingerprint",
    "output_tokens",
    "prompt_estimate",
    "refusal_of",
    "registry_for",
]
