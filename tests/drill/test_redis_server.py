"""The drill's ``redis-server`` helper: a server of its own on a free loopback port, no
persistence, answering at once, stopped (and its directory gone) after; another port
when the one chosen was taken meanwhile; a clear error where redis-server is missing."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator

import pytest

from stormguard_drill import redis_server
from stormguard_drill.redis_server import RedisUnavailable, running_redis
from stormguard_drill.servers import free_port

redis = pytest.importorskip("redis")  # the bench extra's client

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        shutil.which("redis-server") is None, reason="redis-server not on PATH: make setup-redis"
    ),
]


def test_a_server_of_its_own_without_persistence() -> None:
    with running_redis() as server:
        client = redis.Redis(host=server.host, port=server.port)
        try:
            assert client.ping()
            client.set("quota", 1)
            assert client.get("quota") == b"1"
            assert client.config_get("save") == {"save": ""}
            assert client.config_get("appendonly") == {"appendonly": "no"}
            assert client.config_get("bind")["bind"] == "127.0.0.1"
            assert client.config_get("dir")["dir"] == str(server.workdir)
        finally:
            client.close()
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        workdir, process = server.workdir, server.process
    assert process.poll() is not None  # stopped
    assert not workdir.exists()  # nothing left behind
    assert not server.ping()


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_port_taken_meanwhile_means_another_port(
    taken_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    ports = iter([taken_port, free_port()])
    monkeypatch.setattr(redis_server, "free_port", lambda: next(ports))
    with running_redis() as server:
        assert server.port != taken_port
        assert server.ping()


def test_without_redis_server_the_error_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(redis_server.shutil, "which", lambda name: None)
    with pytest.raises(RedisUnavailable, match="make setup-redis"):
        redis_server.start_redis()


def test_killed_it_is_gone_at_once_and_starts_again_on_its_port() -> None:
    with running_redis() as server:
        server.kill()
        assert server.process.poll() is not None and not server.ping()
        again = redis_server.start_redis(port=server.port)
        try:
            assert again.port == server.port and again.ping()
        finally:
            again.stop()
    assert not server.workdir.exists()
