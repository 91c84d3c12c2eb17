"""What the facade asks of a call (``CallSpec``), and how its result is handed
over (``HandOver``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from .._core.results import APIResult, Record
from .stream_timeouts import StreamTimeouts

if TYPE_CHECKING:
    from .._policies.hedge.policy import HedgePolicy
    from .._policies.routing.deployment import Pin
    from .openai_conventions import AttemptTimeouts


#: What a call hands the caller besides its result: nothing (""), the final response
#: with its body read ("response": ``.with_raw_response``), or the final response
#: before its body is read ("unread": ``.with_streaming_response``).
HandOver = Literal["", "response", "unread"]

__all__ = ["CallSpec", "HandOver"]


@dataclass(frozen=True, slots=True)
class CallSpec:
    """What the facade asks for: one logical call."""

    method: str
    path: str
    result_type: type[APIResult]
    operation: str
    body: Mapping[str, Any] | None = None
    stream: bool = False
    chunk_type: type[Record] | None = None
    model: str | None = None
    timeout: float | None = None
    #: Bounds of each attempt's connect, write and pool wait (None: the client's).
    attempt_timeouts: AttemptTimeouts | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    #: Transport mode (``stormguard.httpx_client``): hand back httpx responses, not records.
    raw: bool = False
    #: A URL outside the client's endpoints (transport mode): sent as it is.
    absolute_url: str | None = None
    #: Pre-encoded body (transport mode passes the caller's bytes through unchanged).
    content: bytes | None = None
    #: What the caller gets besides the result (``with_raw_response`` and the like).
    hand_over: HandOver = ""
    #: A stream's first-chunk, idle and overall bounds (None: the client's).
    stream_timeouts: StreamTimeouts | None = None
    #: The tier or deployment the call is held to (None: the best that can take it).
    pin: Pin | None = None
    #: Its prefix-cache affinity key (``_policies/routing/affinity.py``), read once
    #: from the body when the spec is made; None: it goes by load.
    affinity_key: bytes | None = None
    #: Its hedging (``_call/hedge_race.py``): the client's or the call's policy, set
    #: only where another endpoint could take a hedge; None: no hedge.
    hedge: HedgePolicy | None = None

    @property
    def replays_stream(self) -> bool:
        """Whether a stream's bytes read before its first chunk are kept, to be handed
        on as they came (transport mode, ``with_streaming_response``)."""
        return self.raw or self.hand_over == "unread"
