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

This module holds ``Discovery``: when to look, the wait before a call, and
each look's answer applied. Beside it: its settings (and the default resolver)
``discovery_config.py``, a name's live state and its frozen copies ``dns_name.py``,
the calls' wait for a look ``discovery_wait.py``, and the addresses kept and the
endpoints they become ``discovery_endpoints.py``.

Hand-written: resolving is ``socket.getaddrinfo`` (or your function); what no
library offers is the policy around it, which is gRPC's and fits in a page.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..._core.exceptions import APIConnectionError, APITimeoutError
from ..._core.fork import fork_safe_lock
from ..._core.redact import display_url
from .discovery_config import DiscoveryConfig, getaddrinfo_resolver, run_in_thread
from .discovery_endpoints import compose_endpoints, valid_addresses
from .discovery_wait import LookRound
from .dns_name import DiscoveryChange, DiscoveryListener, DiscoverySnapshot, NameState

if TYPE_CHECKING:
    from ..._core.clock import Clock
    from ..._core.deadline import Deadline
    from .endpoint_config import Endpoint
    from .picker import EndpointPicker

__all__ = ["Discovery", "DiscoveryError"]


#: Named for the module it was first written in: the name users filter on.
logger = logging.getLogger("stormguard._discovery")


class DiscoveryError(APIConnectionError):
    """A DNS name of the client has no address to call: its first look failed (or
    found none) and the next is not due yet, or has not answered."""


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
        self._by_entry = {i: NameState(e) for i, (e, dns) in enumerate(self._entries) if dns}
        self._names = list(self._by_entry.values())
        if not self._names:
            raise ValueError("DNS discovery needs at least one endpoint to discover")
        self._picker = picker
        self._clock = clock
        self._resolver = self.config.resolver or getaddrinfo_resolver
        self._executor = self.config.executor or run_in_thread
        self._listeners = tuple(listeners)
        self._scrub = scrub
        self._lock = fork_safe_lock()
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

    def _due(self, name: NameState, now: float) -> bool:
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
                name.round = LookRound(now)
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

    def _wait_for(self, waiting: LookRound, deadline: Deadline) -> float | None:
        """Until the deadline, or until the look is overdue (then another may start)."""
        overdue = waiting.started_at + self.config.resolve_timeout - self._clock.now()
        left = min(deadline.remaining(), max(overdue, 0.0))
        return left if math.isfinite(left) else None

    def _step(self, deadline: Deadline) -> LookRound | None:
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

    def _no_address(self, name: NameState, now: float) -> DiscoveryError:
        why = name.error or f"no answer in {self.config.resolve_timeout:g}s"
        retry = max(name.started_at + self.config.min_refresh_interval - now, 0.0)
        return DiscoveryError(
            f"DNS discovery of {name.label} found no address: {why}; the next look may"
            f" start in {retry:.1f}s"
        )

    # -- one look -------------------------------------------------------------------------

    def _look(self, name: NameState, generation: int, round_: LookRound) -> Callable[[], None]:
        def look() -> None:
            addresses: list[str] = []
            error: str | None = None
            try:
                found = self._resolver(name.host, name.port)
                addresses = valid_addresses(name, found, self.config.max_addresses)
                if not addresses:
                    error = "the name resolved to no address"
            except Exception as exc:  # socket.gaierror, or the user's resolver
                error = self._scrub(f"{type(exc).__name__}: {exc}")[:300]
            try:
                self._looked(name, generation, addresses, error)
            finally:
                round_.finish()

        return look

    def _looked(
        self, name: NameState, generation: int, addresses: list[str], error: str | None
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

    def _apply(self, name: NameState, before: tuple[str, ...]) -> DiscoveryChange:
        """Under the lock: the client's set with ``name``'s new addresses."""
        added, removed = self._picker.replace(compose_endpoints(self._entries, self._by_entry))
        ours = {name.endpoint_name(a) for a in name.addresses or ()}
        old = {name.endpoint_name(a) for a in before}
        return DiscoveryChange(
            name=name.label,
            added=tuple(n for n in added if n in ours),
            removed=tuple(n for n in removed if n in old),
            endpoints=tuple(name.endpoint_name(a) for a in name.addresses or ()),
        )

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
            return tuple(name.snapshot(now) for name in self._names)

    def __repr__(self) -> str:
        names = ", ".join(display_url(name.url) for name in self._names)
        return f"Discovery({names})"
