"""This machine's quota files (``_host_store.HostStore``): a key's bucket shared by the
processes of one host, its bounds, and what it does with files it cannot trust.

tests/e2e/test_quota_no_headers.py runs processes against the reference server."""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import multiprocessing
import os
import time
from pathlib import Path
from typing import BinaryIO

import pytest

import stormguard
from stormguard._policies.quota._bucket import Reply
from stormguard._policies.quota._host_store import DIR_ENV, HostStore, host_directory
from stormguard._policies.quota._registry import QuotaRegistry

NAME = "stormguard:quota:0123456789ab:00112233aabbccdd"


def ask(
    cost: float,
    *,
    limit: float = 0.0,
    new: bool = False,
    room: float = 60.0,
    pause: float = 0.0,
) -> tuple[str, ...]:
    """A reservation's arguments, as ``SharedKeyQuota.reserve`` builds them (tokens only)."""
    tokens = (repr(limit), "1" if new else "0", "", "0.0")
    requests = ("0.0", "0", "", "0.0")
    return (repr(cost), repr(room), "60.0", "60.0", "300", repr(pause), *tokens, *requests)


def reply(store: HostStore, args: tuple[str, ...]) -> Reply:
    answer = store.run_sync(NAME, args)
    assert isinstance(answer, Reply), answer
    return answer


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    return tmp_path / "quota"


def test_a_limit_one_process_learns_paces_another(directory: Path) -> None:
    mine, theirs = HostStore(str(directory)), HostStore(str(directory))
    assert not theirs.known(NAME)  # nothing learned: a call of the key asks nothing
    first = reply(mine, ask(500, limit=600, new=True))
    assert first.granted and first.wait == 0 and first.limit_tokens == 600
    assert theirs.known(NAME)
    # The other process's 500 waits for its turn: 400 short at 10 tokens a second.
    second = reply(theirs, ask(500))
    assert second.granted and 39 < second.wait <= 40
    assert oct(directory.stat().st_mode & 0o777) == "0o700"
    assert oct((directory / os.listdir(directory)[0]).stat().st_mode & 0o777) == "0o600"
    # The credential is not in the name (only its fingerprint, as in Redis).
    assert os.listdir(directory) == [NAME.replace(":", "-") + ".json"]


def _reserve_many(directory: str, count: int) -> list[float]:
    store = HostStore(directory)
    args = ask(0.01, limit=0.6, room=1000.0)
    args = (*args[:2], "3600.0", *args[3:])  # no floor in the way: -0.01 x 3600
    times = []
    for _ in range(count):
        answer = store.run_sync(NAME, args)
        assert isinstance(answer, Reply) and answer.granted, answer
        times.append(answer.now)
    return times


def test_processes_reserving_at_once_lose_no_reservation(directory: Path) -> None:
    # 0.6 tokens a minute: the bucket starts at 0.6 and refills 0.01 a second. Each of
    # 400 reservations takes 0.01, so the level left is exact: a reservation another
    # process overwrote would leave 0.01 more.
    context = multiprocessing.get_context("spawn")
    with context.Pool(2) as pool:
        runs = pool.starmap(_reserve_many, [(str(directory), 200)] * 2)
    fields = json.loads(next(directory.iterdir()).read_text())
    began = min(min(times) for times in runs)
    level = 0.6 - 400 * 0.01 + 0.01 / 60 * 60 * (float(fields["tT"]) - began)
    assert float(fields["tV"]) == pytest.approx(level, abs=1e-6)


@pytest.mark.parametrize(
    "content",
    [b"", b"{not json", b"[1, 2]", b'{"tL": "600"}', b'{"exp": "x"}', b"\xff" * 5000],
)
def test_a_file_that_does_not_parse_or_has_no_lapse_reads_as_empty(
    directory: Path, content: bytes
) -> None:
    store = HostStore(str(directory))
    store.run_sync(NAME, ask(1))  # makes the directory and the file
    path = next(directory.iterdir())
    path.write_bytes(content)
    answer = reply(store, ask(100, limit=600, new=True))
    assert answer.granted and answer.wait == 0 and answer.level_tokens == 500


def test_a_lapsed_file_or_one_from_another_boot_reads_as_empty(directory: Path) -> None:
    store = HostStore(str(directory))
    reply(store, ask(600, limit=600, new=True))  # the bucket is empty
    path = next(directory.iterdir())
    for lapse in (time.monotonic() - 1, time.monotonic() + 10 * 86400):
        fields = json.loads(path.read_text())
        path.write_text(json.dumps({**fields, "exp": repr(lapse)}))
        answer = reply(store, ask(100, limit=600, new=True))
        assert answer.wait == 0 and answer.level_tokens == 500  # full again
        reply(store, ask(500))


def test_hostile_numbers_in_a_file_are_bounded(directory: Path) -> None:
    store = HostStore(str(directory))
    reply(store, ask(1, limit=600, new=True))
    path = next(directory.iterdir())
    fields = json.loads(path.read_text())
    hostile = {"tV": "-1e300", "nb": repr(time.monotonic() + 1e9), "tL": "inf", "tT": "nan"}
    path.write_text(json.dumps({**fields, **hostile}))
    answer = reply(store, ask(100, limit=600))
    # A pause of a billion seconds is held to the longest pause; the rest re-made.
    assert answer.paused_for <= 60 and answer.wait <= 60


def test_a_directory_others_may_use_is_not_used_and_one_warning_says_so(
    directory: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory.mkdir(mode=0o755)
    directory.chmod(0o755)
    store = HostStore(str(directory))
    with caplog.at_level(logging.WARNING, logger="stormguard"):
        assert not store.known(NAME)
        assert isinstance(store.run_sync(NAME, ask(1, limit=600, new=True)), PermissionError)
        assert not store.known(NAME)
    assert store.down and list(directory.iterdir()) == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "others may use" in warnings[0], warnings


def test_a_symlink_for_the_directory_is_not_followed(tmp_path: Path, directory: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    directory.symlink_to(target)
    store = HostStore(str(directory))
    assert isinstance(store.run_sync(NAME, ask(1, limit=600, new=True)), PermissionError)
    assert list(target.iterdir()) == []


def test_a_lock_another_process_holds_is_waited_for_a_bounded_time(directory: Path) -> None:
    store = HostStore(str(directory))
    reply(store, ask(1, limit=600, new=True))
    path = next(directory.iterdir())
    with open(path, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        began = time.monotonic()
        answer = store.run_sync(NAME, ask(1))
        waited = time.monotonic() - began
    assert isinstance(answer, TimeoutError)
    assert store.timeout <= waited < store.timeout + 5  # bounded, however slow the machine
    assert isinstance(store.run_sync(NAME, ask(1)), Reply)  # released: answered again


def _hold_lock(store: HostStore) -> BinaryIO:
    """Make the key's file and hold its lock, as another process would."""
    reply(store, ask(1, limit=600, new=True))
    held = open(next(Path(store.directory).iterdir()), "rb")  # noqa: SIM115
    fcntl.flock(held, fcntl.LOCK_EX)
    return held


async def test_an_async_reservation_waits_for_a_held_lock_without_blocking_its_loop(
    directory: Path,
) -> None:
    store = HostStore(str(directory))
    store.timeout = 60.0  # however slow the machine, it waits for the lock here
    held = _hold_lock(store)
    reservation = asyncio.create_task(store.run_async(NAME, ask(1)))
    for _ in range(50):  # the loop runs while the reservation waits
        await asyncio.sleep(0)
    assert not reservation.done()
    fcntl.flock(held, fcntl.LOCK_UN)
    held.close()
    answer = await reservation
    assert isinstance(answer, Reply) and answer.granted


def test_files_no_process_used_for_long_are_swept(directory: Path) -> None:
    directory.mkdir(mode=0o700)
    old = directory / "stormguard-quota-aaaaaaaaaaaa-0000000000000000.json"
    old.write_text("{}")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    store = HostStore(str(directory))
    reply(store, ask(1, limit=600, new=True))
    assert not old.exists() and len(list(directory.iterdir())) == 1


def test_the_directory_is_the_environments_and_off_turns_sharing_off(
    monkeypatch: pytest.MonkeyPatch, directory: Path
) -> None:
    monkeypatch.setenv(DIR_ENV, str(directory))
    assert host_directory() == str(directory)
    assert isinstance(QuotaRegistry(stormguard.QuotaPolicy(), host=True).store, HostStore)
    assert QuotaRegistry(stormguard.QuotaPolicy(share_on_host=False), host=True).store is None
    assert QuotaRegistry(stormguard.QuotaPolicy(), host=False).store is None  # a test clock
    monkeypatch.setenv(DIR_ENV, "off")
    assert host_directory() is None
    assert QuotaRegistry(stormguard.QuotaPolicy(), host=True).store is None
    monkeypatch.delenv(DIR_ENV)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    assert host_directory() is not None and str(os.getuid()) in str(host_directory())
