"""Property: the admission queue's running totals agree with a brute-force recount.

``AdmissionController`` keeps the queue's tokens per (rank, is_retry) in Fenwick
trees, the order keys beside the queue and an expiry heap, so that no decision
scans the queue. After every step of a random sequence of make_ticket / submit
(in or out of the order the tickets were made) / cancel / release / expire /
pump / engine restart, each piece of that bookkeeping is recomputed from the
queue's contents, and the decisions built on it (tokens ahead, the retry cut,
the victims of a full queue) are compared with the plain scans they replaced.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from stormguard.protocol import Priority
from stormguard_server.admission.controller import AdmissionController
from stormguard_server.admission.tickets import Grant, Ticket
from stormguard_server.config import AdmissionConfig
from stormguard_server.engine.base import EngineLoad

COSTS = [0, 10, 100, 200, 200, 400, 400]  # against a budget of 400: many queue
DEADLINES_MS = [None, None, 100.0, 1000.0]
Op = tuple[str, int, int, Priority]  # what, which (or how long), cost, priority
# Weighted by repetition: tickets are made and submitted more than they leave.
OPS = ["make"] * 4 + ["submit"] * 3 + ["submit_old"] * 2
OPS += ["cancel", "release", "expire", "pump", "restart"]

ops = st.lists(
    st.tuples(
        st.sampled_from(OPS),
        st.integers(0, 1000),
        st.sampled_from(COSTS),
        st.sampled_from(list(Priority)),
    ),
    min_size=40,
    max_size=120,
)
configs = st.builds(
    AdmissionConfig,
    kv_watermark=st.just(1.0),
    max_queue_requests=st.sampled_from([1, 3, 6, 20]),
    max_queue_tokens=st.sampled_from([150, 600, 10**6]),
    max_queue_wait_s=st.sampled_from([1.0, 5.0]),
    retry_queue_fraction=st.sampled_from([0.25, 1.0]),
)


class Harness:
    """A controller over a fake clock and engine, and every ticket it has seen."""

    def __init__(self, config: AdmissionConfig) -> None:
        self.now = 0.0
        self.load = EngineLoad(
            state="ready", kv_cache_usage=0.0, kv_capacity_tokens=400, running=0, waiting=0
        )
        self.ctl = AdmissionController(config, lambda: self.load, clock=lambda: self.now)
        self.unsubmitted: list[Ticket] = []
        self.tickets: list[Ticket] = []

    def step(self, op: str, a: int, cost: int, priority: Priority) -> None:
        ctl, queue = self.ctl, list(self.ctl._queue)
        if op == "make":
            ticket = ctl.make_ticket(
                cost,
                priority=priority,
                attempt=1 + a % 2,
                deadline_ms=DEADLINES_MS[a % len(DEADLINES_MS)],
            )
            self.unsubmitted.append(ticket)
            self.tickets.append(ticket)
        elif op.startswith("submit") and self.unsubmitted:
            # "submit_old" submits a ticket made before others already queued.
            at = a % len(self.unsubmitted) if op == "submit_old" else -1
            ctl.submit(self.unsubmitted.pop(at))
        elif op == "cancel" and self.tickets:
            ticket = self.tickets[a % len(self.tickets)]
            assert ctl.cancel(ticket) is any(t is ticket for t in queue)
        elif op == "release":
            running = [t for t in self.tickets if t.inflight]
            if running:
                ctl.release(Grant(running[a % len(running)], 0.0))
        elif op == "expire":
            self.now += [0.05, 0.3, 1.0][a % 3]
            due = [t for t in queue if self.now >= ctl._expiry(t)]
            assert same(ctl.expire(), due)
        elif op == "pump":
            self.load = replace(self.load, capacity_factor=[0.25, 0.5, 1.0][a % 3])
            admitted = ctl.pump()
            assert same(admitted, queue[: len(admitted)])
        elif op == "restart":
            self.load = replace(self.load, state="restarting", ready_in_s=1.0)
            ctl.tick()
            assert ctl.queue_depth == 0
            self.load = replace(self.load, state="ready")

    def close(self) -> None:
        """Stop the queue's expiry timer. It sleeps in real time, so it would shed this
        example's tickets during a later example, where nothing reads the refusals
        (asyncio then logs "Future exception was never retrieved")."""
        watcher = self.ctl._watcher
        if watcher is not None:
            watcher.cancel()

    def check(self) -> None:
        """Every piece of bookkeeping equals its recomputation from the queue."""
        ctl = self.ctl
        queue = ctl._queue
        for ticket in self.tickets:  # mark refusals as seen (asyncio logs unseen ones)
            if ticket.future is not None and ticket.future.done():
                ticket.future.exception()
        assert ctl._keys == [t.order_key for t in queue] == sorted(t.order_key for t in queue)
        assert len(ctl._queued) == len(queue)
        assert all(ctl._queued[t] == t.shed_key for t in queue)
        assert ctl.queue_tokens == sum(t.cost for t in queue)
        in_heap = {id(t) for _, _, t in ctl._expiries}
        assert all(id(t) in in_heap for t in queue)
        for (rank, retry), group in ctl._groups.items():
            members = sorted(
                (t for t in queue if (t.priority.rank, t.is_retry) == (rank, retry)),
                key=lambda t: t.seq,
            )
            assert same(group.tickets, members)
            assert group.seqs == [t.seq for t in members]
            assert group.tokens == sum(t.cost for t in members)
            for seq in range(-2, len(self.tickets) + 3):
                expected = sum(t.cost for t in members if t.seq < seq)
                assert group.tokens_before(seq) == expected, (rank, retry, seq)
            assert group.tokens_before(10**9) == group.tokens
        # The decisions built on it, for every ticket that could be submitted next.
        fresh = [
            Ticket(cost=cost, priority=priority, attempt=attempt, seq=10**6)
            for priority in Priority
            for cost in (10, 400)
            for attempt in (1, 2)
        ]
        for probe in self.unsubmitted + fresh:
            ahead = [t for t in queue if t.order_key < probe.order_key]
            assert ctl._tokens_ahead(probe) == sum(t.cost for t in ahead)
            limit = ctl.config.max_queue_requests * ctl.config.retry_queue_fraction
            assert ctl._retry_must_go(probe) is (len(ahead) >= limit)
            assert same_or_none(ctl._victims_for(probe), brute_victims(ctl, probe))


def brute_victims(ctl: AdmissionController, newcomer: Ticket) -> list[Ticket] | None:
    """The victim rule as a scan: candidates by shed_key, largest first, until it fits."""
    cfg = ctl.config
    candidates = sorted(
        (t for t in ctl._queue if t.shed_key > newcomer.shed_key),
        key=lambda t: t.shed_key,
        reverse=True,
    )
    victims: list[Ticket] = []
    depth, tokens = len(ctl._queue), ctl.queue_tokens
    for candidate in candidates:
        if depth + 1 <= cfg.max_queue_requests and tokens + newcomer.cost <= cfg.max_queue_tokens:
            break
        victims.append(candidate)
        depth -= 1
        tokens -= candidate.cost
    if depth + 1 > cfg.max_queue_requests or tokens + newcomer.cost > cfg.max_queue_tokens:
        return None
    return victims


def same(a: list[Ticket], b: list[Ticket]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def same_or_none(a: list[Ticket] | None, b: list[Ticket] | None) -> bool:
    return a is b is None or (a is not None and b is not None and same(a, b))


@settings(max_examples=100, deadline=None)
@given(configs, ops)
async def test_bookkeeping_matches_a_brute_force_recount(
    config: AdmissionConfig, steps: list[Op]
) -> None:
    harness = Harness(config)
    try:
        for step in steps:
            harness.step(*step)
            harness.check()
    finally:
        harness.close()


async def test_tokens_before_beyond_the_tree_window() -> None:
    """A seq past the Fenwick tree's window counts everything below it."""
    harness = Harness(AdmissionConfig(kv_watermark=1.0, max_queue_requests=10))
    ctl = harness.ctl
    ctl.submit(ctl.make_ticket(400))  # holds the budget: the rest queue
    for _ in range(3):
        ctl.submit(ctl.make_ticket(10))
    group = ctl._groups[Priority.STANDARD.rank, False]
    window = len(group._tree) - 1
    last = group.seqs[0] + window - 1  # the window's last slot
    ctl.submit(replace(ctl.make_ticket(10), seq=last))
    assert group.tokens_before(last + 1) == group.tokens_before(last + 10**6) == 40
    assert group.tokens_before(last) == 30
    harness.check()
    harness.close()
