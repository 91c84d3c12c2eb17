"""Generate the sync client from the async one, as httpcore generates its sync code.

``sdk/stormguard/_client/client.py`` is ``async_client.py`` with its async words
replaced by their sync twins (the table below) and its lines marked
``# async only`` left out, then sorted and formatted by ruff; so is
``resources.py``. Edit the async files
and run ``make unasync``; ``--check`` (run by tests/sdk/client/test_unasync.py) fails
when a sync file is not what its async twin generates. The I/O that truly
differs lives outside both (``_call/drivers.py``).

    python scripts/unasync.py [--check]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: (async file, sync file) pairs, relative to the repository root.
FILES = [
    ("sdk/stormguard/_client/async_client.py", "sdk/stormguard/_client/client.py"),
    ("sdk/stormguard/_client/async_resources.py", "sdk/stormguard/_client/resources.py"),
]

#: Whole-word replacements, applied in order.
SUBS = [
    ("asynchronous", "synchronous"),
    (r"from \._async_([a-z_]+)", r"from ._\1"),
    ("AsyncHTTPClient", "SyncHTTPClient"),
    ("Async([A-Z][A-Za-z0-9_]*)", r"\1"),
    ("async def", "def"),
    ("async with", "with"),
    ("async for", "for"),
    ("await ", ""),
    ("aclose", "close"),
    ("__aenter__", "__enter__"),
    ("__aexit__", "__exit__"),
    ("async_([a-z][a-z0-9_]*)", r"\1"),
    ("([a-z][a-z0-9_]*)_async", r"\1_sync"),
]
COMPILED = [(re.compile(rf"\b{pattern}\b"), repl) for pattern, repl in SUBS]
#: A line that ends with this comment has no sync twin: it is left out of the sync
#: file (an option only the async client has: ``http_backend``).
ASYNC_ONLY = "# async only"


def unasync(source: str) -> str:
    """``source`` with every async word replaced by its sync twin, and the lines
    marked ``ASYNC_ONLY`` left out (unformatted)."""
    lines = source.splitlines(keepends=True)
    source = "".join(line for line in lines if not line.rstrip().endswith(ASYNC_ONLY))
    for pattern, repl in COMPILED:
        source = pattern.sub(repl, source)
    return source


def ruff(source: str, path: str) -> str:
    """``source`` as ruff sorts its imports and formats it (the project's settings)."""
    for args in (["check", "--select", "I", "--fix-only"], ["format"]):
        source = subprocess.run(  # noqa: S603 - a fixed argv: this Python, ruff, our file
            [sys.executable, "-m", "ruff", *args, "--quiet", "--stdin-filename", path, "-"],
            input=source,
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        ).stdout
    return source


def generated(async_path: str, sync_path: str) -> str:
    """What ``sync_path`` must hold, generated from ``async_path``."""
    return ruff(unasync((ROOT / async_path).read_text()), sync_path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a sync file is stale")
    args = parser.parse_args(argv)
    stale = []
    for async_path, sync_path in FILES:
        text = generated(async_path, sync_path)
        target = ROOT / sync_path
        if target.exists() and target.read_text() == text:
            continue
        if args.check:
            stale.append(sync_path)
        else:
            target.write_text(text)
            print(f"wrote {sync_path}")
    if stale:
        print(f"stale, run `make unasync`: {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
