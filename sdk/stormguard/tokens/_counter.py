"""The TokenCounter seam: one small interface over tiktoken, tokenizers, a server, an estimate."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = ["Message", "TokenCounter", "Tool"]

#: An OpenAI chat message as sent on the wire (``role``, ``content``, ``name``, ``tool_calls``...).
Message = Mapping[str, Any]
#: An OpenAI tool definition (``{"type": "function", "function": {...}}``).
Tool = Mapping[str, Any]


@runtime_checkable
class TokenCounter(Protocol):
    """Counts prompt tokens for one model family, without I/O.

    ``name`` says which counter answered (``"tiktoken:o200k_base"``,
    ``"estimate:utf8-bytes"``) and is reported on every pre-check result and error.
    """

    @property
    def name(self) -> str: ...

    def count_text(self, text: str) -> int:
        """Tokens of ``text`` as a completion prompt (no special tokens added)."""
        ...

    def count_messages(self, messages: Sequence[Message], *, tools: Sequence[Tool] = ()) -> int:
        """Prompt tokens of a chat request: messages, their overhead, tool definitions."""
        ...
