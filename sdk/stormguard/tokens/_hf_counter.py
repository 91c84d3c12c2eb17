"""Counts from a Hugging Face ``tokenizer.json`` (optional extra ``hf``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ._chat import CONSERVATIVE_OVERHEAD, ChatOverhead, count_chat_tokens
from ._counter import Message, Tool

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = ["HuggingFaceCounter"]


class HuggingFaceCounter:
    """Counts with a ``tokenizers.Tokenizer`` loaded from a local ``tokenizer.json``.

    Nothing is downloaded: pass a path (or a ready ``Tokenizer``). ``tokenizers`` is
    imported on first use, so the SDK works without the ``hf`` extra. A
    tokenizer.json holds no chat template, so chat overhead defaults to
    :data:`CONSERVATIVE_OVERHEAD`; for the server's exact template use
    :class:`ServerTokenizeCounter`.
    """

    def __init__(
        self,
        tokenizer: str | Path | Tokenizer,
        *,
        name: str | None = None,
        overhead: ChatOverhead = CONSERVATIVE_OVERHEAD,
    ) -> None:
        self._source = tokenizer
        self._tokenizer: Tokenizer | None = None
        if not isinstance(tokenizer, (str, Path)):
            self._tokenizer = tokenizer
        label = name or (Path(tokenizer).parent.name if isinstance(tokenizer, (str, Path)) else "")
        self._name = f"hf:{label or 'tokenizer'}"
        self.overhead = overhead

    @property
    def name(self) -> str:
        return self._name

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            try:
                from tokenizers import Tokenizer
            except ImportError as exc:
                raise ImportError(
                    "HuggingFaceCounter needs the tokenizers library: pip install 'stormguard[hf]'"
                ) from exc
            self._tokenizer = Tokenizer.from_file(str(self._source))
        return self._tokenizer

    def count_text(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def count_messages(self, messages: Sequence[Message], *, tools: Sequence[Tool] = ()) -> int:
        return count_chat_tokens(messages, self.count_text, tools=tools, overhead=self.overhead)

    def __repr__(self) -> str:
        return f"HuggingFaceCounter({self._name!r})"
