"""``QuotaPolicy``: how a client paces its calls to a hosted API's per-key quota.

The defaults come from a discrete-event simulation of P processes x 8 workers on
one OpenAI-style key (a bucket per dimension refilled at limit / 60 a second,
charged prompt + ``max_tokens`` at admission; 300 calls of 315 tokens, 0.5 s per
answer, 60,000 TPM or 200 RPM): with them, 0 to 2 429s in 300 calls and 1.07 to
1.17 x the ideal wall time for 1, 4 and 16 processes, with every Retry-After
mode (``python -m tests.sdk.policies.quota.quota_sim``; docs/quotas.md has the figures and the
values that lost).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["REDIS_SCHEMES", "QuotaPolicy", "check_redis_url"]


def _positive(name: str, value: object, *, integer: bool = False) -> None:
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise TypeError(f"QuotaPolicy.{name} must be a number, got {type(value).__name__}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"QuotaPolicy.{name} must be a finite number > 0, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class QuotaPolicy:
    """Pace every call to the quota of its API key and model, learned from the
    provider's ``x-ratelimit-*`` headers (else from its 429s). On by default
    (``Client(quota=QuotaPolicy())``); ``quota=None`` turns it off. A key costs
    nothing until its first quota signal: a response with ``x-ratelimit-*``
    headers, or a 429 that refuses a rate.

    >>> QuotaPolicy().window, QuotaPolicy(max_paced_retries=3).max_paced_retries
    (4.0, 3)
    """

    #: Seconds of this process's own sends (and the key's ``remaining`` at their
    #: send times) its share of the key is measured over. Shorter follows a change
    #: in the number of processes faster but measures noisier shares; 4 s won in
    #: simulation over 2-8 s.
    window: float = 4.0
    #: Seconds over which the key's surplus above the reserve is spent: a full bucket
    #: at the start of a batch is used at once (as the provider allows), not a
    #: minute later. 8 s beat 4 s (more 429s with 16 processes) and 16 s (slower).
    drain: float = 8.0
    #: The part of the key's limit kept in reserve (2 %): below it the key is paced
    #: under its refill rate, so that the bucket refills to it and a burst of
    #: several processes finds room. 5 % and 10 % cost wall time; 0 % cost 429s.
    reserve: float = 0.02
    #: A waiting call asks again at least this often (seconds): a rate that rises
    #: (another process stopped) is seen within it.
    recheck: float = 0.5
    #: A quota 429's wait (its Retry-After, else the message's "try again in", else
    #: the spent limit's reset) is the least wait: each waiter waits it times
    #: ``1 + retry_jitter * U(0, 1)``, so the waiters it woke do not collide again.
    retry_jitter: float = 0.5
    #: Quota 429s a call may go back to the pacer for (paced retries, outside the
    #: retry budget and ``max_attempts``); past them a 429 is an ordinary retry.
    max_paced_retries: int = 8
    #: The output a call is charged for when it sets no ``max_tokens`` (nor
    #: ``max_completion_tokens``, ``max_output_tokens``): OpenAI charges prompt +
    #: ``max_tokens`` when it admits a request and does not say what it charges
    #: without; 256 is the reference server's charge. A token pre-check's own
    #: default (``TokenPolicy``) is used when one ran.
    default_output_tokens: int = 256
    #: Keys (x models) whose quota this process keeps; past it, the least recently
    #: used goes (docs/resilience.md, "every per-key table is bounded").
    max_keys: int = 1024
    #: Calls that may wait for one key at once; past it a call fails at once with
    #: ``QuotaWaitError``, as the local queue's ``max_waiting`` bounds it.
    max_waiting: int = 4096
    #: A Redis (or Valkey) server whose buckets every process on a key shares:
    #: ``redis://[:password@]host:port/db``, ``rediss://`` (TLS) or ``unix://``. None:
    #: ``$STORMGUARD_QUOTA_REDIS`` when set, else each process paces on its own.
    #: Needs ``pip install 'stormguard[redis]'``; docs/quotas.md, "Many hosts: a
    #: shared bucket in Redis". Not in the repr: a URL may hold a password.
    redis_url: str | None = field(default=None, repr=False)
    #: The most seconds one Redis call may take (and never past the call's deadline):
    #: past it, or on any Redis error, the call is paced locally and Redis is asked
    #: again after a back-off. A loopback or same-zone Redis answers in ~1 ms, but the
    #: time counts the client's own lag: with 16 processes on 2 cores, 0.1 s timed
    #: out in 7 of them on a loopback Redis, which paced alone and met 23 429s.
    redis_timeout: float = 0.5
    #: Without a Redis, the processes of this machine share each key's bucket through
    #: files in a directory only this user may use (``$STORMGUARD_QUOTA_DIR``; "off"
    #: turns it off there): what one process learns of a key (its limit, a 429's
    #: pause), every process paces to at once. False: each process paces alone, as on
    #: Windows or across hosts. docs/quotas.md, "Many processes on one machine".
    share_on_host: bool = True

    def __post_init__(self) -> None:
        for name in ("window", "drain", "reserve", "recheck", "redis_timeout"):
            _positive(name, getattr(self, name))
        if self.reserve >= 1:
            raise ValueError(f"QuotaPolicy.reserve must be below 1, got {self.reserve!r}")
        if isinstance(self.retry_jitter, bool) or not isinstance(self.retry_jitter, (int, float)):
            raise TypeError("QuotaPolicy.retry_jitter must be a number")
        if not (math.isfinite(self.retry_jitter) and 0 <= self.retry_jitter <= 10):
            raise ValueError(
                f"QuotaPolicy.retry_jitter must be in [0, 10], got {self.retry_jitter!r}"
            )
        for name in ("default_output_tokens", "max_keys", "max_waiting"):
            _positive(name, getattr(self, name), integer=True)
        value = self.max_paced_retries
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"QuotaPolicy.max_paced_retries must be an int >= 0, got {value!r}")
        if self.redis_timeout > 10:
            raise ValueError(
                f"QuotaPolicy.redis_timeout must be at most 10 s, got {self.redis_timeout!r}"
            )
        if self.redis_url is not None:
            check_redis_url(self.redis_url)


#: The URL schemes redis-py connects with.
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def check_redis_url(url: object) -> None:
    """A Redis URL redis-py can connect to; the error never quotes it (a password)."""
    if not isinstance(url, str):
        raise TypeError(f"QuotaPolicy.redis_url must be a str or None, got {type(url).__name__}")
    if not url.lower().startswith(REDIS_SCHEMES) or len(url) > 4096:
        raise ValueError(
            "QuotaPolicy.redis_url must be a redis://, rediss:// or unix:// URL"
            " (e.g. redis://127.0.0.1:6379/0)"
        )
