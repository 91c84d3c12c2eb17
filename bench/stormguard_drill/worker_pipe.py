"""The line protocol between the drill and a client process it spawned (the fleet's and
the quota's workers): one JSON document a line, on the process's stdout and stdin.

The drill's end is ``WorkerProcess``: it spawns ``python -m <worker module>`` and
writes and reads its lines. The worker's end is ``claim_stdout()`` and ``send()``: the
protocol has stdout to itself: ``claim_stdout()`` keeps a copy of the descriptor
for ``send()`` and points descriptor 1 and ``sys.stdout`` at stderr, so whatever a
library prints goes to the run's log, never into the protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any, TextIO

# A process has this long to import, warm up and say it is ready (LiteLLM's first
# import takes seconds of CPU on a busy machine), and this long past the pairing's end
# to send its results.
READY_TIMEOUT_S = 120.0
RESULT_SLACK_S = 60.0
_LINE_LIMIT = 1 << 26  # a process's results are one JSON line
_PROTOCOL: TextIO = sys.stdout  # claim_stdout() gives the protocol a descriptor of its own


def claim_stdout() -> None:
    """Keep stdout for the protocol; everything else written there goes to stderr."""
    global _PROTOCOL
    _PROTOCOL = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # prints of libraries: to the log
    sys.stdout = sys.stderr


def send(document: dict[str, Any] | str) -> None:
    """One line to the drill: a JSON text as it is, or a document to encode."""
    _PROTOCOL.write((document if isinstance(document, str) else json.dumps(document)) + "\n")
    _PROTOCOL.flush()


class WorkerProcess:
    """One client process (a fleet or quota worker), spoken to line by line."""

    def __init__(self, process: asyncio.subprocess.Process, log_path: Path) -> None:
        self.process = process
        self.log_path = log_path

    @classmethod
    async def spawn(cls, log_path: Path, module: str) -> WorkerProcess:
        """``python -m module``, its stderr to ``log_path``."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("wb") as log:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                module,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                limit=_LINE_LIMIT,
            )
        return cls(process, log_path)

    async def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line.encode() + b"\n")
        await self.process.stdin.drain()

    async def receive(self, timeout: float, what: str) -> str:
        assert self.process.stdout is not None
        try:
            line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        except asyncio.TimeoutError:
            raise RuntimeError(f"client process {what}: nothing after {timeout:.0f} s") from None
        if not line:
            await self.process.wait()
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(
                f"client process exited ({self.process.returncode}) before {what}:\n{tail}"
            )
        return line.decode()

    def kill(self) -> None:
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
