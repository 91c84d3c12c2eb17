"""The bytes of a body re-cut into chunks, text or lines, without I/O: the sync and
async ``APIResponse`` feed it what they read."""

from __future__ import annotations

import codecs
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._core.http import httpx


class _Pieces:
    """Re-cuts decoded pieces into ``chunk_size`` bytes, text or lines (``iter_bytes``,
    ``iter_text``, ``iter_lines``), without I/O: the sync and async loops feed it."""

    def __init__(self, response: httpx.Response, chunk_size: int | None, mode: str) -> None:
        self._size = chunk_size
        self._mode = mode
        self._bytes = b""
        self._text = ""
        encoding = response.encoding or "utf-8"
        self._decoder = codecs.getincrementaldecoder(encoding)(errors="replace")

    def feed(self, piece: bytes) -> list[Any]:
        if self._mode == "bytes":
            if self._size is None:
                return [piece] if piece else []
            self._bytes += piece
            out = []
            while len(self._bytes) >= self._size:
                out.append(self._bytes[: self._size])
                self._bytes = self._bytes[self._size :]
            return out
        text = self._decoder.decode(piece)
        if self._mode == "text":
            return self._cut_text(text)
        self._text += text
        lines = self._text.splitlines(keepends=True)
        # The last line may go on in the next piece (and "\r" may be half of "\r\n").
        self._text = lines.pop() if lines and not lines[-1].endswith("\n") else ""
        return [line.rstrip("\r\n") for line in lines]

    def _cut_text(self, text: str) -> list[str]:
        if self._size is None:
            return [text] if text else []
        self._text += text
        out = []
        while len(self._text) >= self._size:
            out.append(self._text[: self._size])
            self._text = self._text[self._size :]
        return out

    def flush(self) -> list[Any]:
        if self._mode == "bytes":
            return [self._bytes] if self._bytes else []
        rest = self._text + self._decoder.decode(b"", final=True)
        if self._mode == "lines":
            return [line.rstrip("\r\n") for line in rest.splitlines(keepends=True)]
        return [rest] if rest else []
