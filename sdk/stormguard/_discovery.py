"""DNS discovery: every address of a name is an endpoint, and the set follows the name.

Client-side balancing in Kubernetes works on a *headless* service: its name has
one A (or AAAA) record per ready pod, and the client spreads its calls over
them itself. ``Client(base_url="http://vllm.ns.svc:8000/v1", discover="dns")``,
or an endpoint URL written ``dns+http://...`` / ``dns+https://...``, resolves
the host to every address it has; each address is an endpoint
(``http://10.0.0.5:8000/v1``, named ``10.0.0.5:8000``; IPv6 bracketed), with
the weight, models and classes of the ``Endpoint`` it came from.

When the set is looked at again (gRPC's dns resolver, with one change):

* every ``refresh_interval`` (30 s) while calls come. gRPC re-resolves only when
  a connection fails, so it never learns of a replica added by a scale-up
  (its users set ``max_connection_age`` for that); a period does;
* sooner, ``min_refresh_interval`` (5 s) after the last look, when a failure
  says the set may be stale: an endpoint ejected as unreachable, every
  endpoint out of rotation, or the last look failed. gRPC's own floor is 30 s
  because it has no period and re-resolves on every failed connection; 5 s is
  the TTL of CoreDNS's cluster records, so looking faster learns nothing new.

Nothing resolves on a call's path: a look runs in a thread of its own (for
``Client`` and ``AsyncClient`` alike; ``getaddrinfo`` takes no timeout and
would hold an event loop), and calls go on with the set they have. A look that
has not answered in ``resolve_timeout`` (10 s, grpc-go's) no longer counts as
running: another may start, but never more than two at once, so a resolver
that hangs for good holds two threads, not one per period.

A look that fails, or finds no address, keeps the last good set (an empty
answer from a DNS server in trouble must not take every endpoint away) and
logs one warning per streak of failures. The first look has no set to keep:
the first calls wait for it within their deadline, and if it failed they raise
``DiscoveryError`` at once (one look per ``min_refresh_interval`` until one
succeeds). A misspelled name is then an error at the first call, not a hang.

An address that stays keeps its ``EndpointState`` (load, ejection) and its name,
so its breakers and concurrency limit keep theirs (``EndpointPicker.replace``);
one that disappears is no longer chosen, while its attempts in flight finish;
a new one starts fresh.

Hand-written: resolving is ``socket.getaddrinfo`` (or your function); what no
library offers is the policy around it, which is gRPC's and fits in a page.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ._endpoints import DNS_SCHEME_PREFIX, split_dns_scheme
from ._exceptions import APIConnectionError, APITimeoutError
from ._http import httpx
from ._redact import display_url

if TYPE_CHECKING:
    from ._clock import Clock
    from ._deadline import Deadline
    from ._endpoints import Endpoint, EndpointPicker, EndpointState

__all__ = [
    "DNS_SCHEME_PREFIX",
    "Discovery",
    "DiscoveryChange",
    "DiscoveryConfig",
    "DiscoveryError",
    "DiscoveryListener",
    "DiscoverySnapshot",
    "Resolver",
    "getaddrinfo_resolver",
    "split_dns_scheme",
]

logger = logging.getLogger(__name__)

#: ``(host, port) -> addresses``: how a name is resolved (run in a thread of its own).
Resolver = Callable[[str, int], Sequence[str]]
#: Runs a look off the call path: a daemon thread of its own by default.
Executor = Callable[[Callable[[], None]], None]


def getaddrinfo_resolver(host: str, port: int) -> list[str]:
    """Every address of ``host`` (A and AAAA records, or the hosts file), in the
    system's order, each once."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _in_thread(job: Callable[[], None]) -> None:
    threading.Thread(target=job, name="stormguard-dns", daemon=True).start()


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class DiscoveryConfig:
    """How DNS discovery looks names up (the module docstring says why each default).

    >>> DiscoveryConfig(refresh_interval=10.0).min_refresh_interval
    5.0
    >>> fixed = DiscoveryConfig(resolver=lambda host, port: ["10.0.0.5", "10.0.0.6"])
    """

    #: Seconds between looks while calls come (a look happens at the first call after).
    refresh_interval: float = 30.0
    #: The least time between two looks, when a failure asks for one sooner.
    min_refresh_interval: float = 5.0
    #: A look that has not answered by then no longer holds the next one back.
    resolve_timeout: float = 10.0
    #: Addresses past this many (in the resolver's order) are left out.
    max_addresses: int = 256
    #: ``(host, port) -> addresses``; ``socket.getaddrinfo`` by default.
    resolver: Resolver | None = None
    #: Runs a look: a daemon thread of its own by default; a test may run it inline
    #: (``executor=lambda look: look()``).
    executor: Executor | None = None

    def __post_init__(self) -> None:
        _positive("refresh_interval", self.refresh_interval)
        _positive("min_refresh_interval", self.min_refresh_interval)
        _positive("resolve_timeout", self.resolve_timeout)
        if self.min_refresh_interval > self.refresh_interval:
            raise ValueError("min_refresh_interval must not exceed refresh_interval")
        count = self.max_addresses
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"max_addresses must be an integer >= 1, got {count!r}")


class DiscoveryError(APIConnectionError):
    """A DNS name of the client has no address to call: its first look failed (or
    found none) and the next is not due yet, or has not answered."""


@dataclass(frozen=True, slots=True)
class DiscoveryChange:
    """The endpoints of a DNS name changed (given to ``discovery_listeners``)."""

    #: The name looked up, ``host:port``.
    name: str
    added: tuple[str, ...]
    removed: tuple[str, ...]
    #: Its endpoints now.
    endpoints: tuple[str, ...]


DiscoveryListener = Callable[[DiscoveryChange], None]


@dataclass(frozen=True, slots=True)
class DiscoverySnapshot:
    """A frozen copy of one DNS name's discovery, for ``client.stats().discovery``."""

    name: str
    #: Its endpoints now (the last good look).
    endpoints: tuple[str, ...]
    looks: int
    failures: int
    #: Why the last look failed (None: it did not).
    last_error: str | None
    #: Seconds since the last good look (None: none yet).
    resolved_ago: float | None


class _Round:
    """One look, as the calls waiting for it see it."""

    __slots__ = ("_done", "_event", "_lock", "_wakes", "started_at")

    def __init__(self, started_at: float) -> None:
        self.started_at = started_at
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._wakes: list[Callable[[], None]] = []
        self._done = False

    def finish(self) -> None:
        with self._lock:
            self._done = True
            wakes, self._wakes = self._wakes, []
        self._event.set()
        for wake in wakes:
            wake()

    def wait(self, timeout: float | None) -> None:
        self._event.wait(timeout)

    async def wait_async(self, timeout: float | None) -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def wake() -> None:  # any thread
            loop.call_soon_threadsafe(_set_result, future)

        with self._lock:
            if self._done:
                return
            self._wakes.append(wake)
        try:
            await asyncio.wait_for(future, timeout)
        except (TimeoutError, asyncio.TimeoutError):  # one class from Python 3.11 on
            pass
        finally:
            with self._lock:
                if wake in self._wakes:
                    self._wakes.remove(wake)


def _set_result(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _Name:
    """One DNS name and what the last looks found (under the discovery's lock)."""

    def __init__(self, template: Endpoint) -> None:
        url = httpx.URL(template.base_url)
        self.template = template
        self.scheme = url.scheme
        self.host = url.host
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.label = f"{_bracketed(self.host)}:{self.port}"
        #: The ``Host`` header: the service's own name, as the caller wrote it.
        self.authority = url.netloc.decode("ascii")
        self.url = url
        self.addresses: tuple[str, ...] | None = None
        self.started_at = -math.inf
        self.resolved_at = -math.inf
        self.generation = 0
        self.applied = 0
        self.in_flight = 0
        self.round: _Round | None = None
        #: A failure asked for a look sooner than the period.
        self.wanted = False
        self.error: str | None = None
        self.looks = 0
        self.failures = 0

    def endpoint_name(self, address: str) -> str:
        own = f"{_bracketed(address)}:{self.port}"
        return own if self.template.name is None else f"{self.template.name}/{own}"


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class Discovery:
    """The DNS names of one client and the looks that keep its endpoints current.

    ``entries`` are the client's endpoints in order, each with whether it is a
    DNS name; a static one is kept as it is, a name stands for its addresses.
    Every change of the set goes to ``picker.replace`` at once.
    """

    def __init__(
        self,
        entries: Sequence[tuple[Endpoint, bool]],
        *,
        picker: EndpointPicker,
        config: DiscoveryConfig | None = None,
        clock: Clock,
        listeners: Sequence[DiscoveryListener] = (),
        scrub: Callable[[str], str] = lambda text: text,
    ) -> None:
        self.config = config if config is not None else DiscoveryConfig()
        self._entries = list(entries)
        #: Each DNS entry's name, by the entry's position.
        self._by_entry = {i: _Name(e) for i, (e, dns) in enumerate(self._entries) if dns}
        self._names = list(self._by_entry.values())
        if not self._names:
            raise ValueError("DNS discovery needs at least one endpoint to discover")
        self._picker = picker
        self._clock = clock
        self._resolver = self.config.resolver or getaddrinfo_resolver
        self._executor = self.config.executor or _in_thread
        self._listeners = tuple(listeners)
        self._scrub = scrub
        self._lock = threading.Lock()
        #: No lock needed before this time: every name has addresses, no look is due.
        self._quiet_until = -math.inf

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name.label for name in self._names)

    def netlocs(self) -> set[str]:
        """The ``host:port`` of every DNS name, as a URL to it is written."""
        return {name.authority for name in self._names}

    # -- when to look ---------------------------------------------------------------------

    def start(self) -> None:
        """The first look at every name (the client calls it when it is made)."""
        self._kick()

    def request_refresh(self) -> None:
        """A failure says the set may be stale: look again as soon as the floor allows."""
        with self._lock:
            for name in self._names:
                name.wanted = True
            self._quiet_until = -math.inf
        self._kick()

    def _kick(self) -> None:
        with self._lock:
            jobs = self._start_due(self._clock.now())
        for job in jobs:
            self._executor(job)

    def _due(self, name: _Name, now: float) -> bool:
        config = self.config
        since = now - name.started_at
        if name.in_flight and (since < config.resolve_timeout or name.in_flight >= 2):
            return False  # one look at a time; a hung one is given company once, no more
        if since >= config.refresh_interval:
            return True
        hurry = name.wanted or name.error is not None or name.addresses is None
        return hurry and since >= config.min_refresh_interval

    def _start_due(self, now: float) -> list[Callable[[], None]]:
        """Under the lock: begin every look that is due; the jobs to run unlocked."""
        jobs: list[Callable[[], None]] = []
        for name in self._names:
            if self._due(name, now):
                name.generation += 1
                name.in_flight += 1
                name.started_at = now
                name.wanted = False
                name.round = _Round(now)
                jobs.append(self._look(name, name.generation, name.round))
        self._quiet_until = self._next_due(now)
        return jobs

    def _next_due(self, now: float) -> float:
        config = self.config
        times = []
        for name in self._names:
            if name.addresses is None:
                return -math.inf  # calls must look at it every time
            if name.in_flight:
                times.append(name.started_at + config.resolve_timeout)
            elif name.wanted or name.error is not None:
                times.append(name.started_at + config.min_refresh_interval)
            else:
                times.append(name.started_at + config.refresh_interval)
        return min(times)

    # -- before a call --------------------------------------------------------------------

    def ready(self, deadline: Deadline) -> None:
        """Start the looks that are due; return once every name has addresses, or raise
        ``DiscoveryError`` (none, and no look running) or ``APITimeoutError``."""
        while (waiting := self._step(deadline)) is not None:
            waiting.wait(self._wait_for(waiting, deadline))

    async def ready_async(self, deadline: Deadline) -> None:
        """``ready`` for a task: the event loop goes on while a look runs."""
        while (waiting := self._step(deadline)) is not None:
            await waiting.wait_async(self._wait_for(waiting, deadline))

    def _wait_for(self, waiting: _Round, deadline: Deadline) -> float | None:
        """Until the deadline, or until the look is overdue (then another may start)."""
        overdue = waiting.started_at + self.config.resolve_timeout - self._clock.now()
        left = min(deadline.remaining(), max(overdue, 0.0))
        return left if math.isfinite(left) else None

    def _step(self, deadline: Deadline) -> _Round | None:
        now = self._clock.now()
        if now < self._quiet_until:
            return None  # the common case: no lock
        with self._lock:
            jobs = self._start_due(now)
        for job in jobs:
            self._executor(job)
        with self._lock:
            now = self._clock.now()
            missing = [name for name in self._names if name.addresses is None]
            if not missing:
                return None
            name = missing[0]
            waiting = name.round
            if waiting is None or now - waiting.started_at >= self.config.resolve_timeout:
                raise self._no_address(name, now)
        if deadline.expired:
            raise APITimeoutError(f"The call's deadline passed while resolving {name.label}")
        return waiting

    def _no_address(self, name: _Name, now: float) -> DiscoveryError:
        why = name.error or f"no answer in {self.config.resolve_timeout:g}s"
        retry = max(name.started_at + self.config.min_refresh_interval - now, 0.0)
        return DiscoveryError(
            f"DNS discovery of {name.label} found no address: {why}; the next look may"
            f" start in {retry:.1f}s"
        )

    # -- one look -------------------------------------------------------------------------

    def _look(self, name: _Name, generation: int, round_: _Round) -> Callable[[], None]:
        def look() -> None:
            addresses: list[str] = []
            error: str | None = None
            try:
                addresses = self._valid(name, self._resolver(name.host, name.port))
                if not addresses:
                    error = "the name resolved to no address"
            except Exception as exc:  # socket.gaierror, or the user's resolver
                error = self._scrub(f"{type(exc).__name__}: {exc}")[:300]
            try:
                self._looked(name, generation, addresses, error)
            finally:
                round_.finish()

        return look

    def _valid(self, name: _Name, found: Sequence[str]) -> list[str]:
        addresses: list[str] = []
        bad = 0
        for raw in found:
            try:
                text = str(ipaddress.ip_address(str(raw)))
            except ValueError:
                bad += 1
                continue
            if text not in addresses:
                addresses.append(text)
        if bad:
            logger.warning("DNS discovery of %s: %d answers were not IP addresses", name.label, bad)
        limit = self.config.max_addresses
        if len(addresses) > limit:
            logger.warning(
                "DNS discovery of %s: %d addresses, the first %d kept (max_addresses)",
                name.label,
                len(addresses),
                limit,
            )
            addresses = addresses[:limit]
        return addresses

    def _looked(
        self, name: _Name, generation: int, addresses: list[str], error: str | None
    ) -> None:
        change: DiscoveryChange | None = None
        warn = recovered = False
        with self._lock:
            now = self._clock.now()
            name.in_flight = max(name.in_flight - 1, 0)
            if generation == name.generation:
                name.round = None
            if generation < name.applied:
                return  # a newer look has answered already
            name.applied = generation
            name.looks += 1
            if error is None:
                recovered = name.error is not None
                name.error = None
                name.resolved_at = now
                if name.addresses is None or set(addresses) != set(name.addresses):
                    before = name.addresses or ()
                    name.addresses = tuple(addresses)
                    change = self._apply(name, before)
            else:
                warn = name.error is None
                name.error = error
                name.failures += 1
            self._quiet_until = self._next_due(now)
        kept = len(name.addresses or ())
        if warn:
            logger.warning(
                "DNS discovery of %s failed (%s); %s",
                name.label,
                error,
                f"keeping its last {kept} endpoints" if kept else "no endpoint yet",
            )
        elif recovered:
            logger.info("DNS discovery of %s answers again", name.label)
        if change is not None:
            self._announce(change)

    def _apply(self, name: _Name, before: tuple[str, ...]) -> DiscoveryChange:
        """Under the lock: the client's set with ``name``'s new addresses."""
        added, removed = self._picker.replace(self._compose())
        ours = {name.endpoint_name(a) for a in name.addresses or ()}
        old = {name.endpoint_name(a) for a in before}
        return DiscoveryChange(
            name=name.label,
            added=tuple(n for n in added if n in ours),
            removed=tuple(n for n in removed if n in old),
            endpoints=tuple(name.endpoint_name(a) for a in name.addresses or ()),
        )

    def _compose(self) -> list[EndpointState]:
        from ._endpoints import EndpointState

        states: list[EndpointState] = []
        seen: set[str] = set()
        for i, (endpoint, dns) in enumerate(self._entries):
            if not dns:
                state = EndpointState(endpoint)
                if state.name not in seen:
                    seen.add(state.name)
                    states.append(state)
                continue
            name = self._by_entry[i]
            for address in name.addresses or ():
                label = name.endpoint_name(address)
                if label in seen:
                    continue  # the same address under two names: the first one keeps it
                seen.add(label)
                url = name.url.copy_with(host=address)
                states.append(
                    EndpointState(
                        replace(endpoint, base_url=str(url), name=label),
                        authority=name.authority,
                        server_hostname=name.host if name.scheme == "https" else None,
                    )
                )
        return states

    def _announce(self, change: DiscoveryChange) -> None:
        logger.info(
            "Endpoints of %s: %d now (+%s, -%s)",
            change.name,
            len(change.endpoints),
            ", ".join(change.added) or "none",
            ", ".join(change.removed) or "none",
        )
        for listener in self._listeners:
            try:
                listener(change)
            except Exception:
                logger.exception("Discovery listener %r failed on %s", listener, change.name)

    # -- what it knows --------------------------------------------------------------------

    def snapshot(self) -> tuple[DiscoverySnapshot, ...]:
        with self._lock:
            now = self._clock.now()
            return tuple(
                DiscoverySnapshot(
                    name=name.label,
                    endpoints=tuple(name.endpoint_name(a) for a in name.addresses or ()),
                    looks=name.looks,
                    failures=name.failures,
                    last_error=name.error,
                    resolved_ago=(
                        now - name.resolved_at if math.isfinite(name.resolved_at) else None
                    ),
                )
                for name in self._names
            )

    def __repr__(self) -> str:
        names = ", ".join(display_url(name.url) for name in self._names)
        return f"Discovery({names})"
