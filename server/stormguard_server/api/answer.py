"""The seam between one request's flow and the API it speaks.

``generation.py`` admits a request, runs it in the engine and ends it, the same
way for every route; what differs is how the result is written: a chat
completion, a text completion, a list of embeddings, a Responses API object, and
for the streamed ones their SSE events. Each API writes its answer with an
object of these protocols, made per request (it may keep state, such as a
stream's sequence numbers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from stormguard_server.engine.base import TokenDelta


@dataclass(frozen=True, slots=True)
class Output:
    """What the engine did for one request, as far as it got."""

    request_id: str
    model: str
    prompt_tokens: int
    text: str
    output_tokens: int
    finish_reason: str | None


class Answer(Protocol):
    """Writes a finished request's JSON body."""

    def body(self, out: Output) -> dict[str, Any]: ...


@runtime_checkable
class SlowAnswer(Answer, Protocol):
    """An answer whose body takes seconds to write (thousands of embedding vectors).
    ``render`` writes its JSON in a worker thread, in pieces (one C-speed step each)
    between which the interpreter hands the event loop its turn: one
    ``json.dumps`` of the whole body would hold it for the whole time."""

    def render(self, out: Output) -> bytes: ...


class StreamAnswer(Answer, Protocol):
    """Writes a request's SSE events as its output arrives.

    ``opening`` comes first (it may keep the request's id and model), ``delta`` for
    each delta, then either ``closing`` (the engine finished) or ``failed`` (it
    failed after the stream began: the status line is out, so the failure is an
    event)."""

    def opening(self, out: Output) -> list[bytes]: ...

    def delta(self, delta: TokenDelta, *, first: bool) -> list[bytes]: ...

    def closing(self, out: Output) -> list[bytes]: ...

    def failed(self, out: Output, *, status: int, code: str, message: str) -> list[bytes]: ...
