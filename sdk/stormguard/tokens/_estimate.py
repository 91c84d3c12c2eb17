"""The last-resort counter: an upper bound that needs no vocabulary at all."""

from __future__ import annotations

from collections.abc import Sequence

from ._chat import CONSERVATIVE_OVERHEAD, ChatOverhead, count_chat_tokens
from ._counter import Message, Tool

__all__ = ["EstimatingCounter"]


class EstimatingCounter:
    """Counts UTF-8 bytes: never fewer than any byte-level BPE (cl100k, o200k, Llama 3...).

    Why it bounds: a byte-level BPE tokenizer splits text into pieces and merges
    each piece's bytes into tokens, and every token covers at least one byte, so a
    text can never have more tokens than UTF-8 bytes. The bound holds for ASCII,
    CJK, emoji and code alike, and for adversarial text (random strings, CSV of
    single digits reach one token per byte in cl100k). Anything tighter, such as
    the popular "4 characters per token", undercounts such text, which is the one
    error a pre-check must not make. The price: natural English is overcounted
    about 4x and CJK about 2x, so this counter is for models nothing exact knows.
    Chat overhead is :data:`CONSERVATIVE_OVERHEAD` (the template is unknown).
    """

    name = "estimate:utf8-bytes"

    def __init__(self, *, overhead: ChatOverhead = CONSERVATIVE_OVERHEAD) -> None:
        self.overhead = overhead

    def count_text(self, text: str) -> int:
        # "surrogatepass": a lone surrogate from bad JSON still counts, as 3 bytes.
        return len(text.encode("utf-8", "surrogatepass"))

    def count_messages(self, messages: Sequence[Message], *, tools: Sequence[Tool] = ()) -> int:
        return count_chat_tokens(messages, self.count_text, tools=tools, overhead=self.overhead)

    def __repr__(self) -> str:
        return "EstimatingCounter()"
