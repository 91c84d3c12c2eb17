"""``KeyState``: one key's quota as a call uses it, whichever holds it: this process
alone (``_key.KeyQuota``) or every process on the key through Redis
(``_shared.SharedKeyQuota``).

It sits above both: its ``reserve`` may return the shared state's ``SharedAsk``, so
neither implementation imports it (they match it by shape), and the modules that
take either one (``_registry``, ``_gate``) import it from here.
"""

from __future__ import annotations

from typing import Protocol

from ._key import Grant, Pace, QuotaKey, QuotaSnapshot
from ._shared import SharedAsk
from ._signals import Reading, Refusal

__all__ = ["KeyState"]


class KeyState(Protocol):
    """One key's quota as a call uses it: this process's own (``KeyQuota``) or one
    shared in Redis (``SharedKeyQuota``), whose ``reserve`` may return the I/O to do
    first (a ``SharedAsk``, answered by the state it carries) and whose calls carry
    what their reservation took (``grant``)."""

    key: QuotaKey

    def reserve(
        self,
        ticket: tuple[int, int],
        cost: float,
        now: float,
        deadline: float,
        waited: float = 0.0,
    ) -> Pace | SharedAsk:
        """Take ``cost`` tokens and one request for the call ``ticket`` (rank, arrival),
        or say how long to sleep (``waited``: what the attempt has waited already);
        raise ``QuotaWaitError`` when its deadline cannot be met."""

    def withdraw(self, ticket: tuple[int, int]) -> None:
        """The call stopped waiting (cancelled, refused elsewhere)."""

    def refund(self, cost: float, grant: Grant | None = None) -> None:
        """A granted call that was never sent: its cost goes back."""

    def charged(self, grant: Grant | None, tokens: float, requests: float) -> None:
        """What the provider charged a sent call it answered (0, 0: nothing)."""

    def observe(
        self,
        t_send: float,
        now: float,
        readings: tuple[Reading | None, Reading | None],
        admitted: float,
    ) -> list[tuple[str, float]]:
        """A response's headers; returns the limits newly learned (dimension, limit)."""

    def refused(
        self,
        t_send: float,
        now: float,
        refusal: Refusal,
        wait: float | None,
        had_headers: bool,
        grant: Grant | None = None,
    ) -> float:
        """A quota 429; returns the pause it set (seconds, jittered)."""

    def least_wait(self, now: float, cost: float) -> float:
        """The lower bound of a wait for ``cost``."""

    def snapshot(self, now: float) -> QuotaSnapshot:
        """A frozen copy, for ``client.stats()``."""

    def view(self) -> tuple[float, float | None, float | None]:
        """This process's share and the key's last ``remaining``, for a span."""

    @property
    def active(self) -> bool:
        """Whether a call waits for the key (it is not evicted then)."""
