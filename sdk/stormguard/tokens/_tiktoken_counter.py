"""Exact counts for OpenAI models with tiktoken, from offline BPE files."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import tiktoken

from ._bpe import offline_encoding
from ._chat import OPENAI_OVERHEAD, ChatOverhead, count_chat_tokens
from ._counter import Message, Tool

__all__ = ["TiktokenCounter"]


class TiktokenCounter:
    """Counts with a tiktoken encoding (``cl100k_base``, ``o200k_base``...).

    The encoding is built offline (see :func:`offline_encoding`); it is loaded on
    first use, not at construction, so creating a policy stays cheap.
    Special-token text such as ``"<|endoftext|>"`` in a prompt is counted as the
    ordinary text the API sees it as.
    """

    def __init__(
        self,
        encoding: str | tiktoken.Encoding,
        *,
        overhead: ChatOverhead = OPENAI_OVERHEAD,
        directories: Sequence[str | Path] = (),
    ) -> None:
        self._encoding = encoding if isinstance(encoding, tiktoken.Encoding) else None
        self._encoding_name = encoding.name if isinstance(encoding, tiktoken.Encoding) else encoding
        self._directories = tuple(directories)
        self.overhead = overhead

    @property
    def name(self) -> str:
        return f"tiktoken:{self._encoding_name}"

    @property
    def encoding(self) -> tiktoken.Encoding:
        """The tiktoken encoding; raises :class:`BPEFileError` when its file is unusable."""
        if self._encoding is None:
            self._encoding = offline_encoding(self._encoding_name, directories=self._directories)
        return self._encoding

    def count_text(self, text: str) -> int:
        return len(self.encoding.encode_ordinary(text))

    def count_messages(self, messages: Sequence[Message], *, tools: Sequence[Tool] = ()) -> int:
        return count_chat_tokens(messages, self.count_text, tools=tools, overhead=self.overhead)

    def __repr__(self) -> str:
        return f"TiktokenCounter({self._encoding_name!r})"
