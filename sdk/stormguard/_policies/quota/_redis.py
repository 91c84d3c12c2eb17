"""``RedisStore``: the Redis side of a shared quota: one bucket per key, taken by one
Lua script per reservation, and the health of the Redis it talks to.

**One script, one round trip.** Each reservation runs ``BUCKET_SCRIPT`` (``EVALSHA``;
``EVAL`` when the server does not have it cached, after a restart or a ``SCRIPT
FLUSH``): it folds in what the process learned since its last call (a limit, the
provider's ``remaining``, what to give back or take, a 429's pause), refills the key's buckets, and
takes the call's cost, or says how long to wait. A reservation may be taken ahead
(golang.org/x/time/rate's ``Reserve``): the bucket goes below 0 and the call sleeps
until its turn, so calls of every process are served in the order they asked, with no
polling. A call whose turn comes after its deadline takes nothing and fails at once
(``rate.Limiter.WaitN``'s "would exceed context deadline").

**Redis's clock, not the caller's.** The script reads ``TIME``: the buckets refill on
one clock for every host (hosts' monotonic clocks share no epoch, and wall clocks
drift), and a send is stamped with the Redis time of its reservation, so the
provider's ``remaining`` is folded in against the same clock.

**What is stored.** One hash per (key fingerprint, host, model), named
``stormguard:quota:<fingerprint>:<hash of host and model>``: never the key. Per
dimension (tokens ``t*``, requests ``r*``): the limit per minute ``L`` and the level
``V`` at time ``T``; and ``nb``, no call before it (a 429's pause). Every call sets
its TTL (``TTL_S``), so an idle key goes away.

**Bounds.** Every number read from Redis or the caller is checked (a non-number,
``nan``, or one past 10^15 reads as absent; a limit below 0.001 a minute too, which
would refill at 0 a second); a key of another type is replaced; no level
falls below ``MAX_PAUSE_S`` of the refill (no reservation waits longer), no pause
lasts past it. The reply is checked field by field: a reply of another shape is a
failure, as a timeout is (``ReplyError``).

**Failure.** Any error, a timeout (``QuotaPolicy.redis_timeout``) or a bad reply
marks the store down (``_store.QuotaStore``): calls are paced locally, one WARNING
says so (the URL's host and port, never its password), and Redis is asked again
after a back-off.
"""

from __future__ import annotations

import hashlib
import random
import weakref
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ..._core.fork import forget_in_child, fork_safe_lock
from ._bucket import Reply, parse_reply
from ._store import QuotaStore

if TYPE_CHECKING:
    pass

__all__ = ["BUCKET_SCRIPT", "RedisStore", "where"]


BUCKET_SCRIPT = """
if redis.replicate_commands then redis.replicate_commands() end
local key = KEYS[1]
local kind = redis.call('TYPE', key)['ok']
if kind ~= 'hash' and kind ~= 'none' then redis.call('DEL', key) end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local function num(x)
  local v = tonumber(x)
  if v == nil or v ~= v or v > 1e15 or v < -1e15 then return nil end
  return v
end
local cost = math.max(num(ARGV[1]) or 0, 0)
local room = num(ARGV[2]) or 0
local maxpause = math.min(math.max(num(ARGV[3]) or 60, 0), 3600)
local cap = math.min(math.max(num(ARGV[4]) or 0, 0), maxpause)
local ttl = math.min(math.max(math.floor(num(ARGV[5]) or 300), 1), 86400)
local pause = math.min(math.max(num(ARGV[6]) or 0, 0), maxpause)
local h = redis.call('HMGET', key, 'tL', 'tV', 'tT', 'rL', 'rV', 'rT', 'nb')
local nb = num(h[7]) or 0
if nb > now + maxpause then nb = now + maxpause end
if pause > 0 and now + pause > nb then nb = now + pause end
local function dim(i, a, need)
  local d = {L = num(h[i]), V = num(h[i + 1]), T = num(h[i + 2])}
  if d.L ~= nil and d.L < 0.001 then d.L = nil end
  local limit, anchor, refund = num(ARGV[a]), num(ARGV[a + 2]), num(ARGV[a + 3]) or 0
  if limit ~= nil and limit >= 0.001 and (ARGV[a + 1] == '1' or d.L == nil) then
    if d.L == nil or d.V == nil or d.T == nil then d.V, d.T = limit, now end
    d.L = limit
  end
  d.wait = 0
  d.take = 0
  if d.L ~= nil then
    local rho = d.L / 60
    if d.V == nil or d.T == nil then d.V, d.T = d.L, now end
    d.V = math.min(d.L, d.V + math.max(now - d.T, 0) * rho + refund)
    if anchor ~= nil then d.V = math.min(d.V, anchor + rho * now) end
    d.V = math.max(d.V, -rho * maxpause)
    d.T = now
    d.take = math.min(need, d.L)
    if d.take > d.V then d.wait = (d.take - d.V) / rho end
  end
  return d
end
local tk = dim(1, 7, cost)
local rq = dim(4, 11, cost > 0 and 1 or 0)
local wait = math.max(nb - now, tk.wait, rq.wait, 0)
local granted = 0
if cost > 0 and wait <= room then
  granted = 1
  if wait > cap then wait = cap end
  for _, d in ipairs({tk, rq}) do
    if d.L ~= nil then d.V = math.max(d.V - d.take, -d.L / 60 * maxpause) end
  end
end
local f = function(x) return string.format('%.17g', x) end
local fields = {'nb', f(nb)}
for _, p in ipairs({{'t', tk}, {'r', rq}}) do
  local d = p[2]
  if d.L ~= nil then
    for _, v in ipairs({{'L', d.L}, {'V', d.V}, {'T', d.T}}) do
      table.insert(fields, p[1] .. v[1])
      table.insert(fields, f(v[2]))
    end
  end
end
redis.call('HSET', key, (table.unpack or unpack)(fields))
redis.call('EXPIRE', key, ttl)
return {tostring(granted), f(wait), f(now),
  f(tk.L or -1), f(tk.V or 0), f(rq.L or -1), f(rq.V or 0), f(math.max(nb - now, 0))}
"""
_SHA = hashlib.sha1(BUCKET_SCRIPT.encode()).hexdigest()  # noqa: S324 - Redis names scripts by SHA-1


def where(url: str) -> str:
    """The URL's host and port (or socket path) for a log line: never a password."""
    try:
        parts = urlsplit(url)
        if parts.scheme == "unix":
            return f"unix:{parts.path}"
        host = parts.hostname or "localhost"
        return f"{host}:{parts.port or 6379}"
    except ValueError:
        return "an unparsable URL"


class RedisStore(QuotaStore):
    """One Redis server's connections (a sync client, one async client per event
    loop), its health (``QuotaStore``), and the script call (module doc). Thread-safe."""

    backend = "redis"

    def __init__(self, url: str, timeout: float, *, rng: random.Random | None = None) -> None:
        self.url = url
        self.where = where(url)
        super().__init__(timeout, f"Redis at {self.where}", rng=rng)
        self._lock = fork_safe_lock()
        self._sync: Any = None
        self._async: dict[int, tuple[weakref.ref[Any], Any]] = {}
        forget_in_child(self)

    def describe(self, error: BaseException) -> str:
        return _describe(error, self.url)

    # -- the script --------------------------------------------------------------

    def run_sync(self, name: str, args: tuple[object, ...]) -> Reply | BaseException:
        """Run the script on the sync client; its reply, or the error (never raised)."""
        try:
            client = self._sync or self._make_sync()
            from redis.exceptions import NoScriptError

            try:
                raw = client.evalsha(_SHA, 1, name, *args)
            except NoScriptError:
                raw = client.eval(BUCKET_SCRIPT, 1, name, *args)
            return parse_reply(raw)
        except Exception as exc:  # any failure of Redis is pacing's, never the call's
            return exc

    async def run_async(self, name: str, args: tuple[object, ...]) -> Reply | BaseException:
        """The async twin of :meth:`run_sync` (``redis.asyncio``, bounded by the
        timeout); off asyncio (trio) it fails, and the call paces locally."""
        import asyncio

        try:
            loop = asyncio.get_running_loop()
            client = self._async_client(loop)
            from redis.exceptions import NoScriptError

            async def run() -> object:
                try:
                    return await client.evalsha(_SHA, 1, name, *args)
                except NoScriptError:
                    return await client.eval(BUCKET_SCRIPT, 1, name, *args)

            return parse_reply(await asyncio.wait_for(run(), self.timeout))
        except Exception as exc:  # any failure of Redis is pacing's, never the call's
            return exc

    def _options(self, *, asynchronous: bool = False) -> dict[str, Any]:
        from redis.asyncio.retry import Retry as AsyncRetry
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        # No retry inside redis-py (its default retries 3 times with a back-off): a
        # failed call paces locally at once, and the store's back-off decides the next.
        retry = AsyncRetry(NoBackoff(), 0) if asynchronous else Retry(NoBackoff(), 0)
        return {
            "socket_timeout": self.timeout,
            "socket_connect_timeout": self.timeout,
            "retry": retry,
            "health_check_interval": 0,
        }

    def _make_sync(self) -> Any:
        import redis

        with self._lock:
            if self._sync is None:
                self._sync = redis.Redis.from_url(self.url, **self._options())
            return self._sync

    def _async_client(self, loop: object) -> Any:
        """The client of ``loop``: a ``redis.asyncio`` pool serves one event loop (as
        an httpx ``AsyncClient`` does); the clients of closed loops are let go of."""
        from redis import asyncio as aioredis

        found = self._async.get(id(loop))
        if found is not None and found[0]() is loop:
            return found[1]
        with self._lock:
            for ident, (ref, _) in list(self._async.items()):
                gone = ref()
                if gone is None or getattr(gone, "is_closed", lambda: False)():
                    del self._async[ident]
            client = aioredis.Redis.from_url(self.url, **self._options(asynchronous=True))
            self._async[id(loop)] = (weakref.ref(loop), client)
            return client

    def _forget_parent_calls(self) -> None:
        """In a forked child: the parent's event loops are not this process's (the sync
        pool checks the process itself, as redis-py's ``ConnectionPool`` does)."""
        self._async.clear()


def _describe(error: BaseException, url: str) -> str:
    """An error for a log line: its class and message, short, without the URL's password."""
    text = f"{type(error).__name__}: {error}"[:200]
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    if password:
        text = text.replace(password, "[redacted]")
    return text
