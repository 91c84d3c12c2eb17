"""Counters compared with tiktoken on ASCII, CJK, emoji and code; the estimate's bound."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

from stormguard.tokens import (
    EstimatingCounter,
    HuggingFaceCounter,
    TiktokenCounter,
    TokenCounter,
    encoding_name_for_model,
)
from tests.sdk.tokens.test_tokens_support import ENCODINGS, SAMPLES, reference_encoding


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tiktoken.Encoding]:
    cache = tmp_path_factory.mktemp("tiktoken-cache")
    return {name: reference_encoding(name, cache) for name in ENCODINGS}


# Text strategies per kind the estimate must bound. Random strings are the hard case:
# they defeat merges, so they sit near one token per byte.
ASCII = st.text(st.characters(min_codepoint=0, max_codepoint=127), max_size=300)
CJK = st.text(
    st.one_of(
        st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF),
        st.characters(min_codepoint=0x3040, max_codepoint=0x30FF),
        st.characters(min_codepoint=0xAC00, max_codepoint=0xD7A3),
        st.characters(min_codepoint=0x20000, max_codepoint=0x2A6DF),
    ),
    max_size=200,
)
EMOJI = st.text(
    st.one_of(
        st.characters(min_codepoint=0x1F300, max_codepoint=0x1FAFF),
        st.sampled_from(["\u200d", "\ufe0f", "\U0001f3fd", " "]),
    ),
    max_size=100,
)
CODE_PIECES = [
    *("def ", "return ", "lambda", "{", "}", "(", ")", "[]", "==", "->", "=>", "//", "/*", "*/"),
    *("    ", "\t", "\n", "x", "_1", "0x1F", "3.14", '"', "'", "#", ";", "`", "$"),
]
CODE = st.lists(st.sampled_from(CODE_PIECES), max_size=200).map("".join)
ANY_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=300)


@pytest.mark.parametrize("name", ENCODINGS)
@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_tiktoken_counter_matches_tiktoken(
    name: str, kind: str, references: dict[str, tiktoken.Encoding]
) -> None:
    text = SAMPLES[kind]
    assert TiktokenCounter(name).count_text(text) == len(references[name].encode_ordinary(text))


def test_known_counts() -> None:
    # From tiktoken's README and OpenAI's cookbook.
    assert TiktokenCounter("cl100k_base").count_text("tiktoken is great!") == 6
    assert TiktokenCounter("o200k_base").count_text("hello world") == 2


@settings(max_examples=60, deadline=None)
@given(text=st.one_of(ASCII, CJK, EMOJI, CODE, ANY_TEXT))
def test_tiktoken_counter_matches_tiktoken_on_generated_text(
    text: str, references: dict[str, tiktoken.Encoding]
) -> None:
    for name in ENCODINGS:
        expected = len(references[name].encode_ordinary(text))
        assert TiktokenCounter(name).count_text(text) == expected


@settings(max_examples=150, deadline=None)
@given(text=st.one_of(ASCII, CJK, EMOJI, CODE, ANY_TEXT))
def test_estimate_never_undercounts(text: str) -> None:
    estimate = EstimatingCounter().count_text(text)
    for name in ENCODINGS:
        assert estimate >= TiktokenCounter(name).count_text(text)


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_estimate_never_undercounts_samples_or_chat(kind: str) -> None:
    text = SAMPLES[kind]
    messages = [
        {"role": "system", "content": text},
        {"role": "user", "name": "bob", "content": text},
    ]
    tools = [{"type": "function", "function": {"name": "f", "description": text}}]
    estimate = EstimatingCounter()
    for name in ENCODINGS:
        exact = TiktokenCounter(name)
        assert estimate.count_text(text) >= exact.count_text(text)
        assert estimate.count_messages(messages, tools=tools) >= exact.count_messages(
            messages, tools=tools
        )


def test_estimate_is_utf8_bytes() -> None:
    assert EstimatingCounter().count_text("aé我👍") == 1 + 2 + 3 + 4


def test_counters_satisfy_the_protocol() -> None:
    for counter in (TiktokenCounter("cl100k_base"), EstimatingCounter()):
        assert isinstance(counter, TokenCounter)
    assert TiktokenCounter("o200k_base").name == "tiktoken:o200k_base"


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        ("gpt-4o", "o200k_base"),
        ("gpt-4o-mini-2024-07-18", "o200k_base"),
        ("o1", "o200k_base"),
        ("o3-mini", "o200k_base"),
        ("o4-mini", "o200k_base"),
        ("o4", "o200k_base"),
        ("gpt-4.1-nano", "o200k_base"),
        ("gpt-4", "cl100k_base"),
        ("gpt-4-turbo", "cl100k_base"),
        ("gpt-3.5-turbo-0125", "cl100k_base"),
        ("openai/gpt-4o", "o200k_base"),
        ("GPT-4O", "o200k_base"),
        ("meta-llama/Llama-3.1-8B-Instruct", None),
        ("mistral", None),
    ],
)
def test_model_to_encoding(model: str, encoding: str | None) -> None:
    assert encoding_name_for_model(model) == encoding


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny byte-level BPE tokenizer trained here: nothing is downloaded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator([*SAMPLES.values()] * 20, trainer=trainer)
    path = tmp_path_factory.mktemp("tiny-bpe") / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def test_huggingface_counter_counts_with_tokenizer_json(tokenizer_json: Path) -> None:
    from tokenizers import Tokenizer

    reference = Tokenizer.from_file(str(tokenizer_json))
    counter = HuggingFaceCounter(tokenizer_json)
    assert counter.name == f"hf:{tokenizer_json.parent.name}"
    assert isinstance(counter, TokenCounter)
    for text in SAMPLES.values():
        expected = len(reference.encode(text, add_special_tokens=False).ids)
        assert counter.count_text(text) == expected
    # Byte-level: unseen text still counts, within the byte bound.
    unseen = "zzqx 龘 🦜"
    assert 0 < counter.count_text(unseen) <= EstimatingCounter().count_text(unseen)


def test_huggingface_counter_chat_adds_conservative_overhead(tokenizer_json: Path) -> None:
    counter = HuggingFaceCounter(tokenizer_json, name="tiny")
    content = SAMPLES["ascii"]
    chat = counter.count_messages([{"role": "user", "content": content}])
    assert counter.name == "hf:tiny"
    assert chat == 8 + counter.count_text("user") + counter.count_text(content) + 8


def test_huggingface_counter_without_tokenizers_says_how_to_install(
    tokenizer_json: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    counter = HuggingFaceCounter(tokenizer_json)  # constructing needs no import
    with pytest.raises(ImportError, match=r"stormguard\[hf\]"):
        counter.count_text("x")
