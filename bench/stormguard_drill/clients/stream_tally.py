"""``StreamTally``: what the drill measures of one streamed call, whichever client
streams it: the first chunk's time (time to first token) and the completion tokens
(the usage chunk's, else one per chunk), which goodput counts. ``whole_answer``: the
same of a call that is not streamed (the quota scenario's, by default): its usage's
completion tokens, no first-token time."""

from __future__ import annotations

import time
from typing import Any

from stormguard_drill.clients.drill_client import CallOutcome


class StreamTally:
    """First-chunk time and completion tokens of one stream."""

    def __init__(self) -> None:
        self.first_at: float | None = None
        self.chunks = 0
        self.usage_tokens: int | None = None

    def saw(self, chunk: Any) -> None:
        if chunk.choices:
            if self.first_at is None:
                self.first_at = time.monotonic()
            self.chunks += 1
        usage = getattr(chunk, "usage", None)  # LiteLLM's chunks may not have the field
        if usage is not None:
            self.usage_tokens = usage.completion_tokens

    def outcome(self) -> CallOutcome:
        tokens = self.usage_tokens if self.usage_tokens is not None else self.chunks
        return CallOutcome(ok=True, completion_tokens=tokens, first_token_at=self.first_at)


def whole_answer(response: Any) -> CallOutcome:
    """The outcome of a chat completion that was not streamed."""
    usage = getattr(response, "usage", None)
    tokens = getattr(usage, "completion_tokens", None) or 0
    return CallOutcome(ok=True, completion_tokens=int(tokens))
