"""The drill's server fleet: servers on ports they chose themselves (read from their
port file), a private directory for an engine's IPC sockets, and nothing left after."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from stormguard_drill.servers import EngineSpec, ServerFleet
from tests.e2e.server_process import FAST_ENGINE_ARGS

pytestmark = pytest.mark.e2e

_IPC_ENV = "STORMGUARD_TEST_IPC_DIR"  # the sim has no IPC sockets: any name will do


def _environment_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {name.decode(): value.decode(errors="replace") for name, _, value in pairs}


def test_servers_bind_ports_of_their_own_and_leave_nothing_behind(tmp_path: Path) -> None:
    async def run() -> None:
        spec = EngineSpec(args=FAST_ENGINE_ARGS, ipc_env=_IPC_ENV)
        async with ServerFleet(tmp_path, spec) as fleet:
            first, second = await asyncio.gather(
                fleet.start("one", admin=True), fleet.start("two", admin=True)
            )
            ports = {first.port, first.admin_port, second.port, second.admin_port}
            assert 0 not in ports and None not in ports and len(ports) == 4
            async with httpx.AsyncClient(timeout=10) as http:
                for server in (first, second):
                    assert (await http.get(f"{server.root}/ready")).status_code == 200
                    faults = await http.get(
                        server.admin_url("/admin/faults"), headers=server.admin_headers
                    )
                    assert faults.status_code == 200
            for server in (first, second):
                assert server.ipc_dir is not None and server.ipc_dir.is_dir()
                assert _environment_of(server.process.pid)[_IPC_ENV] == str(server.ipc_dir)
            assert first.ipc_dir != second.ipc_dir
        for server in (first, second):
            assert server.process.poll() is not None
            assert server.ipc_dir is not None and not server.ipc_dir.exists()
            assert server.port_file is not None and not server.port_file.exists()

    asyncio.run(run())
