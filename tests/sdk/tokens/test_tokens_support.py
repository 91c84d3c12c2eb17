"""Shared helpers of the tokens tests (no tests here).

Reference encodings are built the way tiktoken itself builds them: its own
constructor and loader, fed through its documented offline cache
(``TIKTOKEN_CACHE_DIR`` holding each file under the sha1 of its URL), so that our
re-bound construction is compared with tiktoken's, not with itself.
"""

from __future__ import annotations

import gzip
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tiktoken
import tiktoken_ext.openai_public as openai_public

from stormguard.tokens import bpe_directories

ENCODINGS = ("cl100k_base", "o200k_base")

SAMPLES = {
    "ascii": "The quick brown fox jumps over the lazy dog. It's 3:45pm; isn't it?",
    "cjk": "我能吞下玻璃而不伤身体。私はガラスを食べられます。나는 유리를 먹을 수 있어요.",
    "emoji": "Deploy 🚀 done ✅ — family: 👨‍👩‍👧‍👦, flags: 🇫🇷🇯🇵, skin tones: 👍🏽👋🏿",
    "code": 'def f(x: int) -> dict[str, int]:\n    """Doc."""\n    return {"x": x ** 2}  # 🐍\n',
    "digits": "1,2,3,4,5,6,7,8,9,0 1 2 3 4 5 12345678901234567890",
    "whitespace": "a\n\n\n   b\t\t c    \r\n  ",
    "special": "text with <|endoftext|> and <|fim_prefix|> inside",
}


class FakeClock:
    """A monotonic clock that moves only when told."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _url_of(constructor: Callable[[], Any]) -> str:
    return next(
        c for c in constructor.__code__.co_consts if isinstance(c, str) and c.endswith(".tiktoken")
    )


def reference_encoding(name: str, cache_dir: Path) -> tiktoken.Encoding:
    """``name`` built by tiktoken's own constructor, loader and hash check, offline."""
    constructor = openai_public.ENCODING_CONSTRUCTORS[name]
    url = _url_of(constructor)
    source = next(d / f"{name}.tiktoken.gz" for d in bpe_directories())
    cache_dir.mkdir(parents=True, exist_ok=True)
    (cache_dir / hashlib.sha1(url.encode()).hexdigest()).write_bytes(
        gzip.decompress(source.read_bytes())
    )
    previous = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache_dir)
    try:
        return tiktoken.Encoding(**constructor())
    finally:
        if previous is None:
            del os.environ["TIKTOKEN_CACHE_DIR"]
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = previous


def cookbook_num_tokens(messages: list[dict[str, str]], encoding: tiktoken.Encoding) -> int:
    """OpenAI cookbook's num_tokens_from_messages (gpt-3.5-turbo-0613 and later).

    The one change: special-token text is encoded as plain text, as the API treats it.
    """
    num_tokens = 0
    for message in messages:
        num_tokens += 3
        for key, value in message.items():
            num_tokens += len(encoding.encode(value, disallowed_special=()))
            if key == "name":
                num_tokens += 1
    return num_tokens + 3
