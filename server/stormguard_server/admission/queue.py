"""The admission queue: tickets waiting for admission, ordered by priority, then
arrival, and bounded in requests, tokens and wait.

It answers, each in O(log n) of its length, what the controller
(``controller.py``) asks before deciding: how many tokens wait ahead of a
ticket, whether a retry would wait too far back, which queued tickets matter
less than a newcomer and make room for it when shed, and which waited too
long. It decides nothing and refuses no one; it knows no clock (the controller
passes ``now``) and no engine.
"""

from __future__ import annotations

import bisect
import heapq
import itertools

from stormguard.protocol import Priority, ShedReason
from stormguard_server.admission.tickets import Ticket
from stormguard_server.config import AdmissionConfig


class _Group:
    """The queued tickets of one (priority rank, is_retry), sorted by seq.

    Their tokens also sit in a Fenwick tree indexed by seq, so "tokens of this
    group queued before seq s" costs O(log n) even when a ticket is submitted
    after later-made ones (it then queues ahead of them). The tree covers a
    range of seqs and is rebuilt, in O(range), when a seq falls outside it;
    the range is twice the queued span, so rebuilds are rare (amortized O(1)).
    Seqs are unique (``make_ticket`` stamps them) and costs never negative.
    """

    def __init__(self) -> None:
        self.tickets: list[Ticket] = []
        self.seqs: list[int] = []
        self.tokens = 0
        self._base = 0
        self._tree = [0]  # 1-based Fenwick tree over seqs base .. base + len - 2

    def insert(self, ticket: Ticket) -> None:
        at = bisect.bisect_right(self.seqs, ticket.seq)
        self.seqs.insert(at, ticket.seq)
        self.tickets.insert(at, ticket)
        self.tokens += ticket.cost
        if self._base <= ticket.seq < self._base + len(self._tree) - 1:
            self._add(ticket.seq, ticket.cost)
        else:
            self._rebuild()

    def remove(self, ticket: Ticket) -> None:
        at = bisect.bisect_left(self.seqs, ticket.seq)
        while self.tickets[at] is not ticket:
            at += 1
        del self.seqs[at], self.tickets[at]
        self.tokens -= ticket.cost
        self._add(ticket.seq, -ticket.cost)

    def tokens_before(self, seq: int) -> int:
        """Tokens of this group's tickets whose seq is below ``seq``."""
        i = min(seq - self._base, len(self._tree) - 1)
        total = 0
        while i > 0:
            total += self._tree[i]
            i -= i & -i
        return total

    def _add(self, seq: int, tokens: int) -> None:
        i, size = seq - self._base + 1, len(self._tree)
        while i < size:
            self._tree[i] += tokens
            i += i & -i

    def _rebuild(self) -> None:
        self._base = self.seqs[0]
        size = 64
        while size < 2 * (self.seqs[-1] - self._base + 1):
            size *= 2
        tree = [0] * (size + 1)
        for ticket in self.tickets:
            tree[ticket.seq - self._base + 1] += ticket.cost
        for i in range(1, size + 1):  # linear-time Fenwick construction
            parent = i + (i & -i)
            if parent <= size:
                tree[parent] += tree[i]
        self._tree = tree


def _new_groups() -> dict[tuple[int, bool], _Group]:
    """An empty group per (rank, is_retry), in ascending order (shedding takes
    them from the end)."""
    keys = sorted((p.rank, retry) for p in Priority for retry in (False, True))
    return {key: _Group() for key in keys}


class AdmissionQueue:
    """The tickets waiting for admission, with the indexes that spare every
    decision a scan; see the module docstring."""

    def __init__(self, config: AdmissionConfig) -> None:
        self.config = config
        # The queue, sorted by order_key, with the keys alongside for bisect; the same
        # tickets by (rank, is_retry) with their token sums; each queued ticket's
        # shed_key as it was queued; and a heap of (expiry, push number, ticket) in
        # which tickets that left stay until they surface. No decision then scans the
        # queue: each is O(log n) in its length (list inserts and pops are memmoves).
        self.tickets: list[Ticket] = []
        self.keys: list[tuple[int, int]] = []
        self.groups = _new_groups()
        self.queued: dict[Ticket, tuple[int, bool, int]] = {}
        self.expiries: list[tuple[float, int, Ticket]] = []
        self._pushes = itertools.count()  # heap tie-break: tickets do not compare
        self.tokens = 0

    def __len__(self) -> int:
        return len(self.tickets)

    def expiry(self, ticket: Ticket) -> float:
        """When ``ticket`` stops waiting: its deadline or the longest wait, the sooner."""
        limit = ticket.arrival + self.config.max_queue_wait_s
        return limit if ticket.deadline is None else min(limit, ticket.deadline)

    def overflow(self, cost: int) -> ShedReason | None:
        """The bound a newcomer of ``cost`` tokens would pass (requests first), or None."""
        cfg = self.config
        over_requests = len(self.tickets) + 1 > cfg.max_queue_requests
        over_tokens = self.tokens + cost > cfg.max_queue_tokens
        if over_requests or over_tokens:
            return ShedReason.QUEUE_FULL if over_requests else ShedReason.TOKEN_BUDGET
        return None

    def push(self, ticket: Ticket) -> int:
        """Queue ``ticket`` in serving order; returns its place (0 = next)."""
        rank, retry, seq = self.queued[ticket] = ticket.shed_key
        at = bisect.bisect_right(self.keys, (rank, seq))
        self.keys.insert(at, (rank, seq))
        self.tickets.insert(at, ticket)
        self.groups[rank, retry].insert(ticket)
        expiries = self.expiries
        heapq.heappush(expiries, (self.expiry(ticket), next(self._pushes), ticket))
        if len(expiries) > 2 * len(self.tickets) + 64:  # without due() calls too
            self.expiries = [e for e in expiries if e[2] in self.queued]
            heapq.heapify(self.expiries)
        self.tokens += ticket.cost
        return at

    def remove(self, ticket: Ticket) -> bool:
        """Take a ticket out of the queue (its heap entry stays until it expires);
        True when it was queued."""
        key = self.queued.pop(ticket, None)
        if key is None:
            return False
        rank, retry, seq = key
        at = bisect.bisect_left(self.keys, (rank, seq))
        while self.tickets[at] is not ticket:
            at += 1
        del self.tickets[at], self.keys[at]
        self.groups[rank, retry].remove(ticket)
        self.tokens -= ticket.cost
        return True

    def clear(self) -> list[Ticket]:
        """Empty the queue; returns what was in it, in serving order."""
        gone = list(self.tickets)
        self.tickets.clear()
        self.keys.clear()
        self.groups = _new_groups()
        self.queued.clear()
        self.expiries.clear()
        self.tokens = 0
        return gone

    def next_expiry(self) -> float | None:
        """The earliest expiry of a queued ticket (entries of tickets that left are
        dropped on the way); None when the queue is empty."""
        expiries = self.expiries
        while expiries and expiries[0][2] not in self.queued:
            heapq.heappop(expiries)
        return expiries[0][0] if expiries else None

    def due(self, now: float) -> list[Ticket]:
        """Queued tickets whose expiry is ``now`` or earlier, in serving order. They
        stay queued: the caller removes each (and refuses it) in turn."""
        expired: dict[Ticket, None] = {}  # a ticket queued twice has two entries
        while self.expiries and now >= self.expiries[0][0]:
            _, _, ticket = heapq.heappop(self.expiries)
            if ticket in self.queued:
                expired[ticket] = None
        return sorted(expired, key=self._order_key)

    def victims_for(self, newcomer: Ticket) -> list[Ticket] | None:
        """Queued tickets that matter less than ``newcomer`` and whose removal makes
        room for it; None when the newcomer itself is the one to shed.

        Candidates are the tickets with a larger shed_key, taken largest first: every
        ticket of the groups (rank, is_retry) above the newcomer's, newest first, then
        those of its own group newer than it. The totals decide up front whether
        removing them all makes room (costs are never negative, so otherwise no
        subset does); then only the victims themselves are visited.
        """
        cfg = self.config
        rank, retry, seq = newcomer.shed_key
        own = self.groups[rank, retry]
        above = [g for key, g in self.groups.items() if key > (rank, retry)]
        depth = len(self.tickets) - sum(len(g.seqs) for g in above)
        depth -= len(own.seqs) - bisect.bisect_right(own.seqs, seq)
        tokens = self.tokens - sum(g.tokens for g in above)
        tokens -= own.tokens - own.tokens_before(seq + 1)
        if depth + 1 > cfg.max_queue_requests or tokens + newcomer.cost > cfg.max_queue_tokens:
            return None
        victims: list[Ticket] = []
        depth, tokens = len(self.tickets), self.tokens
        for key, group in reversed(self.groups.items()):
            if key < (rank, retry):
                break
            first = bisect.bisect_right(group.seqs, seq) if group is own else 0
            for i in range(len(group.tickets) - 1, first - 1, -1):
                if (
                    depth + 1 <= cfg.max_queue_requests
                    and tokens + newcomer.cost <= cfg.max_queue_tokens
                ):
                    return victims
                victims.append(group.tickets[i])
                depth -= 1
                tokens -= group.tickets[i].cost
        return victims

    def retry_must_go(self, ticket: Ticket) -> bool:
        """True when ``ticket`` would queue behind the retries' share of the request
        limit (``retry_queue_fraction``)."""
        limit = self.config.max_queue_requests * self.config.retry_queue_fraction
        ahead = bisect.bisect_left(self.keys, ticket.order_key)
        return ahead >= limit

    def tokens_ahead(self, ticket: Ticket) -> int:
        """Tokens queued before ``ticket`` would be: every group of a lower rank, and
        the tickets of its own rank made before it."""
        rank, seq = ticket.order_key
        return sum(
            group.tokens if key[0] < rank else group.tokens_before(seq)
            for key, group in self.groups.items()
            if key[0] <= rank
        )

    def _order_key(self, ticket: Ticket) -> tuple[int, int]:
        """A queued ticket's order_key as it was queued."""
        rank, _, seq = self.queued[ticket]
        return rank, seq
