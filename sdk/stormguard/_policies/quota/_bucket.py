"""A key's shared bucket, whichever store keeps it: its name (``bucket_name``), the
reply of a reservation (``Reply``, ``parse_reply``), and ``bucket_step``: one
reservation, in Python, for the buckets this machine's processes share through files
(``_host_store.py``).

It is the step ``_redis.BUCKET_SCRIPT`` makes in Lua inside Redis, line for line: the
same fields in, the same fields and reply out, the same bounds on every number read.
Redis can only run Lua and a file store can only run Python, so the step is written
twice; ``tests/sdk/policies/quota/test_quota_bucket.py`` runs both on the same
inputs (the Lua through fakeredis) and holds them equal. Read the script's doc and
``_shared.py`` for what each field and argument means.

``fields`` is the key's stored hash (``tL tV tT rL rV rT nb``; absent when new),
``argv`` the script's ``ARGV`` as ``SharedKeyQuota.reserve`` builds it, ``now`` the
store's clock. It returns the fields to store and the reply ``parse_reply`` reads.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..limiter.aimd import MAX_PAUSE_S

if TYPE_CHECKING:
    from ._key import QuotaKey

__all__ = ["TTL_S", "Reply", "ReplyError", "bucket_name", "bucket_step", "parse_reply"]

#: Seconds an idle key's bucket lives: five times a bucket's refill from empty to full,
#: after which the provider's bucket is full again (a bucket made anew starts full).
TTL_S = 300

_BOUND = 1e15
#: A limit per minute below it reads as absent: it would refill at 0 a second.
_LEAST_LIMIT = 0.001


def _num(x: object) -> float | None:
    """Lua's ``num``: a number within +-10^15, else None (absent, garbage, nan, inf)."""
    if x is None:
        return None
    if isinstance(x, bytes):
        x = x.decode("ascii", "replace")
    try:
        value = float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    if value != value or value > _BOUND or value < -_BOUND:
        return None
    return value


def _or(value: float | None, default: float) -> float:
    """Lua's ``x or d`` for a number: 0 is a value, not absent."""
    return default if value is None else value


@dataclass(slots=True)
class _Dim:
    limit: float | None
    level: float | None
    at: float | None
    wait: float = 0.0
    take: float = 0.0


def _dim(
    fields: Mapping[str, object],
    prefix: str,
    argv: Sequence[object],
    a: int,
    need: float,
    now: float,
    maxpause: float,
) -> _Dim:
    d = _Dim(
        _num(fields.get(prefix + "L")),
        _num(fields.get(prefix + "V")),
        _num(fields.get(prefix + "T")),
    )
    if d.limit is not None and d.limit < _LEAST_LIMIT:
        d.limit = None
    limit, anchor = _num(argv[a]), _num(argv[a + 2])
    refund = _or(_num(argv[a + 3]), 0.0)
    if limit is not None and limit >= _LEAST_LIMIT and (str(argv[a + 1]) == "1" or d.limit is None):
        if d.limit is None or d.level is None or d.at is None:
            d.level, d.at = limit, now
        d.limit = limit
    if d.limit is not None:
        rho = d.limit / 60
        if d.level is None or d.at is None:
            d.level, d.at = d.limit, now
        d.level = min(d.limit, d.level + max(now - d.at, 0) * rho + refund)
        if anchor is not None:
            d.level = min(d.level, anchor + rho * now)
        d.level = max(d.level, -rho * maxpause)
        d.at = now
        d.take = min(need, d.limit)
        if d.take > d.level:
            d.wait = (d.take - d.level) / rho
    return d


def _f(x: float) -> str:
    return "%.17g" % x  # noqa: UP031 - Lua's string.format('%.17g'), to the digit


def bucket_step(
    fields: Mapping[str, object], argv: Sequence[object], now: float
) -> tuple[dict[str, str], tuple[str, ...]]:
    """One reservation: the fields to store and the script's reply (module doc)."""
    cost = max(_or(_num(argv[0]), 0.0), 0.0)
    room = _or(_num(argv[1]), 0.0)
    maxpause = min(max(_or(_num(argv[2]), 60.0), 0.0), 3600.0)
    cap = min(max(_or(_num(argv[3]), 0.0), 0.0), maxpause)
    pause = min(max(_or(_num(argv[5]), 0.0), 0.0), maxpause)
    nb = _or(_num(fields.get("nb")), 0.0)
    if nb > now + maxpause:
        nb = now + maxpause
    if pause > 0 and now + pause > nb:
        nb = now + pause
    tk = _dim(fields, "t", argv, 6, cost, now, maxpause)
    rq = _dim(fields, "r", argv, 10, 1.0 if cost > 0 else 0.0, now, maxpause)
    wait = max(nb - now, tk.wait, rq.wait, 0.0)
    granted = 0
    if cost > 0 and wait <= room:
        granted = 1
        if wait > cap:
            wait = cap
        for d in (tk, rq):
            if d.limit is not None:
                assert d.level is not None
                d.level = max(d.level - d.take, -d.limit / 60 * maxpause)
    stored = {str(k): str(v) for k, v in fields.items()}
    stored["nb"] = _f(nb)
    for prefix, d in (("t", tk), ("r", rq)):
        if d.limit is not None:
            assert d.level is not None and d.at is not None
            stored[prefix + "L"], stored[prefix + "V"] = _f(d.limit), _f(d.level)
            stored[prefix + "T"] = _f(d.at)
    reply = (
        str(granted),
        _f(wait),
        _f(now),
        _f(tk.limit if tk.limit is not None else -1),
        _f(tk.level if tk.level is not None else 0),
        _f(rq.limit if rq.limit is not None else -1),
        _f(rq.level if rq.level is not None else 0),
        _f(max(nb - now, 0)),
    )
    return stored, reply


class ReplyError(Exception):
    """Redis answered something that is not the script's reply."""


@dataclass(frozen=True, slots=True)
class Reply:
    """The script's answer, checked."""

    granted: bool
    #: Seconds to wait (granted: then send; not granted: what the call would have waited).
    wait: float
    #: Redis's clock when it ran (seconds since the epoch).
    now: float
    #: The shared limits per minute (None: no process has learned one) and levels.
    limit_tokens: float | None
    level_tokens: float
    limit_requests: float | None
    level_requests: float
    #: Seconds left of the shared pause a 429 asked for.
    paused_for: float

    @property
    def known(self) -> bool:
        """Whether the shared bucket knows a limit (else it paces nothing)."""
        return self.limit_tokens is not None or self.limit_requests is not None


_FIELDS = 8
_BIG = 1e18


def parse_reply(raw: object) -> Reply:
    """The script's reply, or ``ReplyError`` for anything else (a wrong length, a
    non-number, a value out of range)."""
    if not isinstance(raw, (list, tuple)) or len(raw) != _FIELDS:
        raise ReplyError(f"the quota script answered a {type(raw).__name__}, not its reply")
    values: list[float] = []
    for item in raw:
        if isinstance(item, bytes):
            item = item.decode("ascii", "replace")
        if not isinstance(item, (str, int)) or isinstance(item, bool):
            raise ReplyError("the quota script's reply holds a value of another type")
        try:
            value = float(item)
        except ValueError:
            raise ReplyError("the quota script's reply holds a non-number") from None
        if not -_BIG <= value <= _BIG:  # also nan
            raise ReplyError("the quota script's reply holds a number out of range")
        values.append(value)
    granted, wait, now, lt, vt, lr, vr, paused = values
    if granted not in (0.0, 1.0) or wait < 0 or paused < 0 or now <= 0:
        raise ReplyError("the quota script's reply is out of range")
    return Reply(
        granted=granted == 1.0,
        wait=min(wait, MAX_PAUSE_S),
        now=now,
        limit_tokens=lt if lt > 0 else None,
        level_tokens=vt,
        limit_requests=lr if lr > 0 else None,
        level_requests=vr,
        paused_for=min(paused, MAX_PAUSE_S),
    )


def bucket_name(key: QuotaKey) -> str:
    """The name of a key's shared bucket (a Redis hash, a file): its fingerprint and a
    hash of its host and model, never the credential (nor a model name of unbounded
    length)."""
    place = hashlib.sha256(f"{key.host}\0{key.model}".encode("utf-8", "surrogatepass"))
    return f"stormguard:quota:{key.fingerprint}:{place.hexdigest()[:16]}"
