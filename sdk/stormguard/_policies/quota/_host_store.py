"""``HostStore``: the keys' shared buckets in files on this machine, so that the
processes of one host divide a key as one, on by default.

**Why.** Without ``x-ratelimit-*`` headers a process learns the key only from its own
429s: each of 16 processes on one key must meet at least one (1.053 requests per call
on a 300-call batch before any other), and a process that starts late starts from too
small a share (docs/quotas.md, "Without headers"). A bucket in Redis shares what one
process learns with all of them; most batches run on one machine, where a file does
the same without a server.

**What is stored.** One file per (key, host, model) in a directory only this user may
use (``$STORMGUARD_QUOTA_DIR``, else ``$XDG_RUNTIME_DIR/stormguard-quota``, else
``<tmp>/stormguard-quota-<uid>``; mode 0700, checked: a directory of another user, a
symlink or one others may write is not used). The file's name is the Redis key's
(the credential's fingerprint and a hash of host and model, never the key); it holds
the Redis hash's seven numbers as JSON, and when it lapses (``TTL_S`` after its last
reservation, or a stamp from another boot: the clock is ``time.monotonic``, which
every process of a machine shares). A file that does not parse is read as empty.

**One reservation** opens the file, takes an exclusive ``flock`` (a process that
dies holding it loses it), runs ``bucket_step`` (the Redis script's step, in Python)
and writes the result back: ~20 us. A call of a key this process does not pace yet
only checks that the key's file exists (``known``: one ``stat``), so a key no process
has learned a limit for costs nothing more. A lock held by another process is asked
for again every millisecond for at most ``LOCK_WAIT_S`` (an async call sleeps between
asks, never blocking its loop); past it, or on any error (a full disk, a directory that
is not ours), the key is paced in this process alone (``_store.QuotaStore``).

Not on Windows (no ``flock``) nor across hosts (use Redis for those): there each
process paces alone, as ``STORMGUARD_QUOTA_DIR=off`` or ``QuotaPolicy(share_on_host=
False)`` ask for everywhere.
"""

from __future__ import annotations

import functools
import json
import os
import stat
import tempfile
import time
from typing import TYPE_CHECKING

from ._bucket import TTL_S, bucket_step, parse_reply
from ._store import QuotaStore

if TYPE_CHECKING:
    import random

    from ._bucket import Reply

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["DIR_ENV", "LOCK_WAIT_S", "HostStore", "host_directory"]

#: The directory of the quota files; "off" turns the sharing off.
DIR_ENV = "STORMGUARD_QUOTA_DIR"
#: The most seconds a reservation waits for another process's lock (one holds it for
#: tens of microseconds; a process the scheduler stopped holding it, for a few ms).
LOCK_WAIT_S = 0.25
#: How often a held lock is asked for again (seconds).
_RETRY_S = 0.001
#: The most bytes read of a file (its seven numbers take ~300).
_MAX_BYTES = 4096


def host_directory() -> str | None:
    """The directory this machine's quota files go in (module doc), or None: off, or
    no ``flock`` here."""
    if fcntl is None:
        return None  # type: ignore[unreachable]  # on Windows
    configured = os.environ.get(DIR_ENV, "").strip()
    if configured.lower() == "off":
        return None
    if configured:
        return configured
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "stormguard-quota")
    return os.path.join(tempfile.gettempdir(), f"stormguard-quota-{os.getuid()}")


class _Busy(Exception):
    """Another process holds the key's lock."""


class HostStore(QuotaStore):
    """The quota files of one directory (module doc). Thread-safe: each reservation
    opens its own descriptor."""

    backend = "host"
    #: ``time.monotonic``: every process's clock, and the system clock registry's.
    offset = 0.0

    def __init__(self, directory: str, *, rng: random.Random | None = None) -> None:
        super().__init__(LOCK_WAIT_S, f"quota directory {directory}", rng=rng)
        self.directory = directory
        self._ready = False

    # -- the call's side ---------------------------------------------------------

    def known(self, name: str) -> bool:
        if self.down:
            return False
        if not self._ready:
            try:
                self._prepare()
            except OSError as exc:
                self.failed(time.monotonic(), exc)
                return False
        path = self._path(name)
        if not os.access(path, os.F_OK):  # the common case, and without an exception
            return False
        try:
            return os.stat(path).st_size > 0
        except OSError:
            return False

    def run_sync(self, name: str, args: tuple[object, ...]) -> Reply | BaseException:
        """One reservation in the key's file; its reply, or the error (never raised)."""
        give_up = time.monotonic() + self.timeout
        while (answer := self._try(name, args, give_up)) is None:
            time.sleep(_RETRY_S)
        return answer

    async def run_async(self, name: str, args: tuple[object, ...]) -> Reply | BaseException:
        """:meth:`run_sync`, sleeping on the event loop while another process holds the
        lock (off asyncio, trio, it fails and the call paces locally)."""
        import asyncio

        give_up = time.monotonic() + self.timeout
        while (answer := self._try(name, args, give_up)) is None:
            try:
                await asyncio.sleep(_RETRY_S)
            except RuntimeError as exc:  # no asyncio loop running
                return exc
        return answer

    def _try(self, name: str, args: tuple[object, ...], give_up: float) -> Reply | Exception | None:
        """One try: the reply, the error, or None: another process holds the lock and
        there is time to ask again."""
        try:
            return self._reserve(name, args)
        except _Busy:
            if time.monotonic() >= give_up:
                return TimeoutError(f"another process held the lock for {self.timeout} s")
            return None
        except Exception as exc:  # any failure of the files is pacing's, never the call's
            return exc

    # -- inside ------------------------------------------------------------------

    def _path(self, name: str) -> str:
        return _joined(self.directory, name)

    def _prepare(self) -> None:
        """Make the directory (0700) or check the one there is ours alone; drop the
        files that lapsed. Raises ``OSError`` (``PermissionError``) when it is not."""
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        info = os.lstat(self.directory)
        if not stat.S_ISDIR(info.st_mode):
            raise PermissionError(f"{self.directory} is not a directory")
        if info.st_uid != os.getuid():
            raise PermissionError(f"{self.directory} belongs to another user")
        if info.st_mode & 0o077:
            mode = info.st_mode & 0o777
            raise PermissionError(f"others may use {self.directory} (mode {mode:o})")
        self._ready = True
        self._sweep()

    def _sweep(self) -> None:
        """Remove the files no process has reserved in for twice ``TTL_S`` (lapsed: a
        key left idle, whose provider's bucket is full again). Bounded by the keys
        used in that time."""
        cutoff = time.time() - 2 * TTL_S
        try:
            with os.scandir(self.directory) as entries:
                for entry in entries:
                    if entry.name.endswith(".json") and entry.stat().st_mtime < cutoff:
                        os.unlink(entry.path)
        except OSError:
            pass  # another process swept it first, or it went: nothing is lost

    def _reserve(self, name: str, args: tuple[object, ...]) -> Reply:
        if not self._ready:
            self._prepare()
        assert fcntl is not None
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(self._path(name), flags, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise _Busy from None
            if os.fstat(fd).st_nlink == 0:  # swept between the open and the lock
                raise _Busy
            now = time.monotonic()
            fields = _read(os.pread(fd, _MAX_BYTES, 0), now)
            stored, reply = bucket_step(fields, args, now)
            stored["exp"] = repr(now + _ttl(args))
            blob = json.dumps(stored, separators=(",", ":")).encode()
            os.pwrite(fd, blob, 0)
            os.ftruncate(fd, len(blob))
        finally:
            os.close(fd)  # and the lock with it
        return parse_reply(list(reply))


@functools.lru_cache(maxsize=4096)
def _joined(directory: str, name: str) -> str:
    """A key's file in ``directory``, worked out once: every call of a key no process
    paces yet looks for it."""
    return os.path.join(directory, _file_name(name))


def _file_name(name: str) -> str:
    return name.replace(":", "-") + ".json"


def _read(blob: bytes, now: float) -> dict[str, object]:
    """The fields a file holds, or none: empty, not a JSON object of strings, lapsed,
    or stamped by another boot (its lapse more than a TTL ahead of now)."""
    try:
        fields = json.loads(blob) if blob else {}
    except ValueError:
        return {}
    if not isinstance(fields, dict):
        return {}
    try:
        lapse = float(fields.get("exp", "nan"))
    except (TypeError, ValueError):
        return {}
    if not now < lapse <= now + 86400:
        return {}
    return {k: v for k, v in fields.items() if isinstance(v, str)}


def _ttl(args: tuple[object, ...]) -> float:
    """The TTL the reservation asks for (the script's ``ARGV[5]``), bounded as it is."""
    try:
        ttl = float(str(args[4]))
    except (IndexError, ValueError):
        return float(TTL_S)
    return min(max(ttl, 1.0), 86400.0) if ttl == ttl else float(TTL_S)
