"""Starting and stopping the real server process."""

from __future__ import annotations

import signal

import pytest

from .server_process import run_server


@pytest.mark.parametrize("admin", [False, True], ids=["main only", "with admin"])
def test_ctrl_c_stops_the_server_cleanly(admin: bool) -> None:
    with run_server(admin=admin) as server:
        server.process.send_signal(signal.SIGINT)
        code = server.process.wait(timeout=30)
        log = server.log()
    assert code == 0, log
    assert "Traceback" not in log and "KeyboardInterrupt" not in log
