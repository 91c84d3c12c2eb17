"""The sync client is generated from the async one: the committed file is what
scripts/unasync.py makes of it, and the generation maps every async word."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[3]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("unasync", ROOT / "scripts" / "unasync.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("unasync", module)
    spec.loader.exec_module(module)
    return module


def test_the_sync_client_is_what_the_async_one_generates() -> None:
    unasync = _script()
    for async_path, sync_path in unasync.FILES:
        expected = unasync.generated(async_path, sync_path)
        assert (ROOT / sync_path).read_text() == expected, f"run `make unasync`: {sync_path}"


def test_async_words_become_their_sync_twins() -> None:
    unasync = _script().unasync
    source = (
        "async def create(self) -> AsyncStream[Chunk]:\n"
        "    async with self._lock:\n"
        "        async for part in await run_call_async(core, http, spec):\n"
        "            await self._http.aclose()\n"
        "    return async_to_raw_response_wrapper(AsyncHTTPClient, _async_client)\n"
        "from ._async_resources import AsyncChat\n"
    )
    assert unasync(source) == (
        "def create(self) -> Stream[Chunk]:\n"
        "    with self._lock:\n"
        "        for part in run_call_sync(core, http, spec):\n"
        "            self._http.close()\n"
        "    return to_raw_response_wrapper(SyncHTTPClient, _async_client)\n"
        "from ._resources import Chat\n"
    )


def test_the_sync_files_have_no_async_word_left() -> None:
    for _, sync_path in _script().FILES:
        text = (ROOT / sync_path).read_text()
        for word in ("async def", "async with", "async for", "await ", "Async", "aclose", "anyio"):
            assert word not in text, (sync_path, word)
