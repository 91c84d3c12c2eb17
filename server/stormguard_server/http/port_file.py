"""``--port-file``: the ports the server bound, for a script that asked for port 0.

Picking a free port and passing it races with every other process on the machine
(another may bind it first, and a harness would then talk to that one); binding
port 0 does not, and this file says which port the OS gave. It is JSON,
``{"port": P, "admin_port": A or null}``, written once every server listens and
replaced whole, so a reader sees it complete or not at all; a file left from an
earlier run is removed at start, and this one at exit.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import NamedTuple

__all__ = ["BoundPorts", "PortReport", "read_port_file"]


class BoundPorts(NamedTuple):
    port: int
    admin_port: int | None


def read_port_file(path: Path) -> BoundPorts | None:
    """The ports a server wrote to ``path``, or None while it does not listen yet."""
    try:
        ports = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    return BoundPorts(ports["port"], ports["admin_port"])


class PortReport:
    """Writes the port file once the main server (and the admin server, if any) listen."""

    def __init__(self, path: str | None, *, admin: bool) -> None:
        self._path = None if path is None else Path(path)
        self._admin = admin
        self._port: int | None = None
        self._admin_port: int | None = None
        self.remove()

    def remove(self) -> None:
        if self._path is not None:
            self._path.unlink(missing_ok=True)

    def main_listening(self, port: int) -> None:
        self._port = port
        self._write()

    def admin_listening(self, port: int) -> None:
        self._admin_port = port
        self._write()

    def _write(self) -> None:
        if self._path is None or self._port is None or (self._admin and self._admin_port is None):
            return
        partial = self._path.with_name(f".{self._path.name}.{os.getpid()}.tmp")
        partial.write_text(json.dumps({"port": self._port, "admin_port": self._admin_port}))
        os.replace(partial, self._path)
