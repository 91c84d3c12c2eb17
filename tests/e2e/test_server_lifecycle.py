"""Starting and stopping the real server process, and what it tells at start."""

from __future__ import annotations

import json
import signal

import httpx
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


def test_without_a_token_given_the_one_logged_at_start_opens_the_admin_endpoint() -> None:
    # --log-level error: the token line is written at any level.
    with run_server("--admin-port", "0", "--log-level", "error") as server:
        admin_port = server.admin_port
        lines = [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]
        logged = [line for line in lines if line.get("event") == "admin_token"]
        assert len(logged) == 1, server.log()
        token = logged[0]["admin_token"]
        assert server.log().count(token) == 2  # its field and its message, in that one line
        url = f"http://127.0.0.1:{admin_port}/admin/faults"
        assert httpx.get(url, timeout=10).status_code == 401
        wrong = httpx.get(url, headers={"authorization": f"Bearer {token[::-1]}"}, timeout=10)
        assert wrong.status_code == 401 and token not in wrong.text
        right = httpx.get(url, headers={"authorization": f"Bearer {token}"}, timeout=10)
        assert right.status_code == 200 and right.json()["oom_crash"] is True
        server.admin_token = token
        assert server.admin_post("/admin/faults", {"error_rate": 0.5}).json()["error_rate"] == 0.5
        assert server.log().count(token) == 2  # and never again


def test_the_port_file_names_the_ports_bound_while_they_are_the_servers() -> None:
    # run_server asks for port 0 twice and reads which ports it got from this file.
    with run_server(admin=True) as server:
        ports = json.loads(server.port_file.read_text())
        assert ports == {"port": server.port, "admin_port": server.admin_port}
        assert 0 not in (server.port, server.admin_port) and server.port != server.admin_port
        assert httpx.get(server.url("/ready"), timeout=10).status_code == 200
        assert server.admin_get("/admin/faults").status_code == 200
        server.process.send_signal(signal.SIGINT)
        assert server.process.wait(timeout=30) == 0, server.log()
        assert not server.port_file.exists()
