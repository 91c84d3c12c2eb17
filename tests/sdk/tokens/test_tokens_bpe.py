"""Offline BPE files: found in the installed package, checked against tiktoken's hashes."""

from __future__ import annotations

import gzip
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tiktoken

import stormguard.tokens._bpe as bpe
from stormguard.tokens import (
    BPEFileError,
    TiktokenCounter,
    TokenPolicy,
    bpe_directories,
    offline_encoding,
)
from tests.sdk.tokens.test_tokens_support import ENCODINGS, SAMPLES, reference_encoding


def _block_sockets(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    attempts: list[object] = []

    def refuse(*args: object, **kwargs: object) -> None:
        attempts.append(args)
        raise OSError("network disabled in this test")

    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    return attempts


@pytest.fixture
def fresh_cache() -> None:
    bpe._cached_encoding.cache_clear()


def _plain_copy(name: str, directory: Path) -> Path:
    source = next(d / f"{name}.tiktoken.gz" for d in bpe_directories())
    target = directory / f"{name}.tiktoken"
    target.write_bytes(gzip.decompress(source.read_bytes()))
    return target


def test_the_installed_package_ships_both_encodings() -> None:
    files = {p.name for d in bpe_directories() for p in d.iterdir()}
    assert {"cl100k_base.tiktoken.gz", "o200k_base.tiktoken.gz"} <= files


@pytest.mark.parametrize("name", ENCODINGS)
def test_offline_encoding_equals_tiktokens_own(name: str, tmp_path: Path) -> None:
    ours = offline_encoding(name)
    reference = reference_encoding(name, tmp_path)
    assert ours.name == reference.name == name
    assert ours._pat_str == reference._pat_str
    assert ours._special_tokens == reference._special_tokens
    assert ours.n_vocab == reference.n_vocab
    for text in SAMPLES.values():
        assert ours.encode_ordinary(text) == reference.encode_ordinary(text)


@pytest.mark.usefixtures("fresh_cache")
def test_counting_works_with_sockets_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    attempts = _block_sockets(monkeypatch)
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
    counter = TiktokenCounter("o200k_base")
    assert counter.count_text("hello world") == 2
    assert TiktokenCounter("cl100k_base").count_text("tiktoken is great!") == 6
    check = TokenPolicy().precheck(
        "gpt-4o", "chat", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    )
    assert check.counter == "tiktoken:o200k_base"
    assert attempts == []


def test_import_and_first_count_never_touch_the_network() -> None:
    script = textwrap.dedent(
        """
        import sys
        attempts = []
        def refuse_network(event, args):
            # Audit events fire for every socket, from Python or C code alike.
            if event.startswith(("socket.", "urllib.")):
                attempts.append(event)
                raise OSError(f"network disabled: {event}")
        sys.addaudithook(refuse_network)
        import stormguard
        import stormguard.tokens as tokens
        assert "tokenizers" not in sys.modules, "tokenizers must be imported lazily"
        policy = tokens.TokenPolicy()
        check = policy.precheck("gpt-4o", "completion", {"prompt": "hello", "max_tokens": 1})
        print(check.counter, check.prompt_tokens, len(attempts))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "TIKTOKEN_CACHE_DIR": "/nonexistent"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["tiktoken:o200k_base", "1", "0"]


def test_a_plain_file_in_a_given_directory_is_used(tmp_path: Path) -> None:
    _plain_copy("cl100k_base", tmp_path)
    encoding = offline_encoding("cl100k_base", directories=[tmp_path])
    assert encoding.encode_ordinary("hello world") == [15339, 1917]


def test_a_file_with_the_wrong_hash_is_refused(tmp_path: Path) -> None:
    path = _plain_copy("cl100k_base", tmp_path)
    data = path.read_bytes()
    path.write_bytes(data.replace(b" 0\n", b" 1\n", 1))  # one rank changed
    with pytest.raises(BPEFileError, match=r"sha256 [0-9a-f]{64}, tiktoken expects 2239"):
        offline_encoding("cl100k_base", directories=[tmp_path])


def test_a_missing_file_is_refused_with_a_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bpe, "bpe_directories", lambda: ())
    with pytest.raises(BPEFileError, match=r"o200k_base\.tiktoken not found.*stormguard\[bpe\]"):
        offline_encoding("o200k_base", directories=[tmp_path])


def test_a_missing_distribution_means_no_directories(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bpe, "BPE_DISTRIBUTION", "no-such-distribution-for-stormguard")
    assert bpe.bpe_directories() == ()


@pytest.mark.parametrize(
    ("name", "match"), [("gpt2", "no installed package"), ("nope", "unknown tiktoken encoding")]
)
def test_unsupported_encodings_are_refused(name: str, match: str) -> None:
    with pytest.raises(BPEFileError, match=match):
        offline_encoding(name)


def test_harmony_is_built_from_the_o200k_file() -> None:
    harmony = offline_encoding("o200k_harmony")
    assert harmony.encode("<|start|>", allowed_special="all") == [200006]
    assert harmony.encode_ordinary("hello") == offline_encoding("o200k_base").encode_ordinary(
        "hello"
    )


def test_tiktoken_itself_is_left_untouched() -> None:
    offline_encoding("cl100k_base")
    import tiktoken_ext.openai_public as openai_public
    from tiktoken.load import load_tiktoken_bpe

    assert openai_public.load_tiktoken_bpe is load_tiktoken_bpe
    assert "cl100k_base" not in tiktoken.registry.ENCODINGS


def test_without_bpe_files_openai_models_degrade_to_server_then_estimate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import stormguard.tokens._policy as policy_module

    def missing(name: str, **kwargs: object) -> tiktoken.Encoding:
        raise BPEFileError(f"{name} missing")

    monkeypatch.setattr(policy_module, "offline_encoding", missing)
    policy = TokenPolicy()
    assert policy.counter_for("gpt-4o").name == "estimate:utf8-bytes"
    assert policy.counter_for("gpt-4o", base_url="http://h/v1").name == "server:/tokenize"
