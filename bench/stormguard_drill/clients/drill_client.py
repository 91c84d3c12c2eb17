"""What a client under test is to the drill: its name, the ``DrillClient`` protocol
every one of them follows, the ``CallOutcome`` of one call, and ``ClientUnavailable``
for one that cannot run here. The clients themselves: the package's other modules
(``registry.py`` builds one by name)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, get_args

from stormguard_drill.workload import Arrival

ClientName = Literal[
    "openai", "openai+tenacity", "stormguard", "openai+sg-httpx", "litellm", "litellm-router"
]
CLIENT_NAMES: tuple[ClientName, ...] = get_args(ClientName)
AVALANCHE_CLIENTS: tuple[ClientName, ...] = CLIENT_NAMES[:3]
LITELLM_CLIENTS: frozenset[ClientName] = frozenset({"litellm", "litellm-router"})
MODEL = "stormguard-sim"
API_KEY = "drill"  # the reference server does not check keys


class ClientUnavailable(Exception):
    """A client that cannot run here (LiteLLM not installed); the message says why."""


@dataclass(frozen=True, slots=True)
class CallOutcome:
    """One call as the application sees it (the client's own retries inside)."""

    ok: bool
    completion_tokens: int = 0
    first_token_at: float | None = None  # time.monotonic() of the first chunk
    error: str | None = None  # exception class name of a failure


class DrillClient(Protocol):
    name: ClientName

    async def call(self, arrival: Arrival) -> CallOutcome: ...

    def attempts(self) -> int | None:
        """HTTP attempts sent so far, as the client counts them (None: it does not)."""
        ...

    def gauges(self) -> dict[str, float]:
        """The client's own state now, sampled with the server's metrics (stormguard:
        the concurrency limit); empty for clients without any."""
        ...

    def stats(self) -> dict[str, float]:
        """Counters kept at the end of a pairing (stormguard: requeues, budgets)."""
        ...

    async def aclose(self) -> None: ...
