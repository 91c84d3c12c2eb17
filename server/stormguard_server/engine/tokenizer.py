"""A deterministic offline tokenizer for the simulated engine.

The sim engine needs prompt token counts that are stable, cheap and roughly
the size a BPE tokenizer would give, without any vocabulary file (no network
here, so tiktoken's BPE files are not an option). Rule: text is split into
words, runs of punctuation and whitespace-prefixed words (like GPT-style
pre-tokenizers); a word of up to 8 characters (its leading space included)
is one token, a longer one is cut into pieces of 6. English prose comes out
near 1.1 tokens per word, the ballpark of cl100k (about 1.3). A token's id
is the CRC-32 of its text modulo the vocabulary size.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Sequence

VOCAB_SIZE = 50_000
_WHOLE_WORD_CHARS = 8
_PIECE_CHARS = 6
_PRETOKEN = re.compile(r" ?\w+| ?[^\w\s]+|\s+")


def split_tokens(text: str) -> list[str]:
    """The token strings of ``text``; joining them gives ``text`` back."""
    pieces: list[str] = []
    for match in _PRETOKEN.finditer(text):
        word = match.group()
        if len(word) <= _WHOLE_WORD_CHARS:
            pieces.append(word)
            continue
        for start in range(0, len(word), _PIECE_CHARS):
            pieces.append(word[start : start + _PIECE_CHARS])
    return pieces


def token_id(piece: str) -> int:
    """Stable id of one token string."""
    return zlib.crc32(piece.encode("utf-8", "surrogatepass")) % VOCAB_SIZE


def encode(text: str) -> list[int]:
    """Token ids of ``text``."""
    return [token_id(piece) for piece in split_tokens(text)]


def count_tokens(text: str) -> int:
    """Number of tokens in ``text``."""
    return len(split_tokens(text))


def apply_chat_template(
    messages: Iterable[tuple[str, str]], *, add_generation_prompt: bool = True
) -> str:
    """The prompt text for chat messages given as (role, content) pairs.

    Role markers cost a few tokens each, like the special tokens of a real
    chat template; the assistant marker is appended for generation.
    """
    parts = [f"<|{role}|>\n{content}\n" for role, content in messages]
    if add_generation_prompt:
        parts.append("<|assistant|>\n")
    return "".join(parts)


# The words the sim engine "generates"; each is one token when prefixed by a space.
OUTPUT_WORDS: Sequence[str] = (
    "the",
    "storm",
    "guard",
    "keeps",
    "queue",
    "short",
    "and",
    "sheds",
    "load",
    "with",
    "care",
    "so",
    "every",
    "call",
    "ends",
    "well",
)


def output_piece(seed: int, index: int) -> str:
    """The ``index``-th generated token for a request seeded with ``seed``."""
    word = OUTPUT_WORDS[zlib.crc32(f"{seed}:{index}".encode()) % len(OUTPUT_WORDS)]
    return f" {word}"
