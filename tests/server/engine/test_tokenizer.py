"""The offline tokenizer is deterministic, lossless and near BPE sizes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from stormguard_server.engine import tokenizer


def test_counts_are_near_bpe_sizes() -> None:
    assert tokenizer.count_tokens("hello world") == 2
    assert tokenizer.count_tokens("Hello, world!") == 4
    assert tokenizer.count_tokens("internationalization") == 4
    prose = "The quick brown fox jumps over the lazy dog. " * 10
    assert 90 <= tokenizer.count_tokens(prose) <= 130


@given(st.text(max_size=300))
def test_split_is_lossless_and_ids_are_stable(text: str) -> None:
    pieces = tokenizer.split_tokens(text)
    assert "".join(pieces) == text
    assert tokenizer.encode(text) == tokenizer.encode(text)
    assert all(0 <= i < tokenizer.VOCAB_SIZE for i in tokenizer.encode(text))


def test_chat_template_adds_role_markers_and_generation_prompt() -> None:
    prompt = tokenizer.apply_chat_template([("user", "hi")])
    assert prompt == "<|user|>\nhi\n<|assistant|>\n"
    assert not tokenizer.apply_chat_template(
        [("user", "hi")], add_generation_prompt=False
    ).endswith("<|assistant|>\n")
