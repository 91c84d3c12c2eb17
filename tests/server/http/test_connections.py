"""connections.py: the server runs the hardened protocol, and its connection limit
fits the file-descriptor limit. (What the protocol does to slow clients is shown
end to end in tests/e2e/test_hostile_client.py.)"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource

import pytest

from stormguard_server.http.connections import (
    ConnectionLimits,
    HardenedH11Protocol,
    fit_to_fd_limit,
    summarize_accept_failures,
    uvicorn_config,
)


async def _app(scope: object, receive: object, send: object) -> None:  # pragma: no cover
    pass


def test_the_server_picks_the_hardened_protocol_explicitly() -> None:
    limits = ConnectionLimits(header_timeout_s=3, body_timeout_s=4, max_connections=5)
    config = uvicorn_config(_app, host="127.0.0.1", port=0, limits=limits)
    config.load()
    protocol = config.http_protocol_class
    assert issubclass(protocol, HardenedH11Protocol)
    assert protocol.limits == limits  # type: ignore[attr-defined]
    assert HardenedH11Protocol.limits == ConnectionLimits()  # the base class is untouched
    assert config.ws_protocol_class is None  # no upgrade can leave the protocol
    assert config.limit_concurrency is None  # uvicorn's own counts idle connections


@pytest.mark.parametrize(
    "bad",
    [
        {"header_timeout_s": 0},
        {"body_timeout_s": -1},
        {"body_timeout_s": float("nan")},
        {"max_connections": 0},
    ],
)
def test_limits_that_cannot_hold_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ConnectionLimits(**bad)  # type: ignore[arg-type]


class FakeRlimit:
    def __init__(self, soft: int, hard: int, can_raise: bool = True) -> None:
        self.soft, self.hard, self.can_raise = soft, hard, can_raise

    def getrlimit(self, which: int) -> tuple[int, int]:
        assert which == resource.RLIMIT_NOFILE
        return self.soft, self.hard

    def setrlimit(self, which: int, limits: tuple[int, int]) -> None:
        if not self.can_raise or limits[0] > self.hard:
            raise ValueError("not allowed")
        self.soft = limits[0]


def test_the_soft_fd_limit_is_raised_when_the_hard_one_allows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeRlimit(soft=1024, hard=1_048_576)
    monkeypatch.setattr(resource, "getrlimit", fake.getrlimit)
    monkeypatch.setattr(resource, "setrlimit", fake.setrlimit)
    assert fit_to_fd_limit(2048, reserve=128) == 2048
    assert fake.soft == 1_048_576  # all of it: room for a burst past the limit


@pytest.mark.parametrize("can_raise", [True, False])
def test_past_the_hard_fd_limit_the_connection_limit_is_lowered_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, can_raise: bool
) -> None:
    fake = FakeRlimit(soft=1024, hard=1024, can_raise=can_raise)
    monkeypatch.setattr(resource, "getrlimit", fake.getrlimit)
    monkeypatch.setattr(resource, "setrlimit", fake.setrlimit)
    with caplog.at_level(logging.WARNING, logger="stormguard_server.connections"):
        assert fit_to_fd_limit(2048, reserve=128) == 1024 - 128
    assert "connection limit lowered" in caplog.text


def test_a_limit_that_fits_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeRlimit(soft=20_000, hard=20_000, can_raise=False)
    monkeypatch.setattr(resource, "getrlimit", fake.getrlimit)
    assert fit_to_fd_limit(2048) == 2048


def test_accept_running_out_of_fds_is_one_warning_not_an_error_per_try(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = asyncio.new_event_loop()
    passed_on: list[dict[str, object]] = []
    loop.set_exception_handler(lambda loop, context: passed_on.append(context))
    try:
        handler = summarize_accept_failures(loop, every_s=10.0)
        emfile = OSError(errno.EMFILE, "Too many open files")
        with caplog.at_level(logging.WARNING, logger="stormguard_server.connections"):
            for _ in range(4000):  # what one burst of accept() tries made asyncio log
                handler(
                    loop, {"message": "socket.accept() out of system resource", "exception": emfile}
                )
        assert [
            r.getMessage().startswith("accept() out of file descriptors") for r in caplog.records
        ] == [True]
        assert caplog.records[0].event == "accept_out_of_fds"  # type: ignore[attr-defined]
        other = {"message": "Task exception was never retrieved", "exception": emfile}
        handler(loop, other)
        assert passed_on == [other]  # anything else goes where it went before
        assert loop.get_exception_handler() is handler
    finally:
        loop.close()
