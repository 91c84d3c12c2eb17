"""The adversarial review's cases, re-measured: hostile servers against the SDK,
hostile input against the reference server.

    .venv/bin/python bench/bench_hostile.py [--cases NAME ...] [--cap 30] [--json out.json]

Each case runs in a process of its own (a fresh high-water mark of memory, and a
hard wall-clock cap: a client still blocked at ``--cap`` seconds is reported as
such, not waited for), sync and async where the SDK has both. The hostile server
is ``tests/e2e/hostile_server.py``; the reference server is started on a free
loopback port. Every figure sits beside what the review measured before the fixes.

SDK cases (a stormguard client against a server that misbehaves):

- ``precheck-silent``: ``timeout=0.5`` with a token pre-check; the server never
  answers ``/tokenize``, ``/v1/models`` or the call (review: returned after 4.0 s);
- ``precheck-drip``: ``timeout=2``, the lookups' response headers come a byte a
  second (review: still blocked at 60 s);
- ``precheck-bomb``: ``timeout=10``, ``/tokenize`` and ``/v1/models`` answer a
  1 GiB gzip bomb (review: RSS grew by 3.1 GB);
- ``drip-headers``: ``timeout=2``, response headers a byte a second (review: sync
  still blocked at 120 s, async 2.02 s);
- ``drip-body``: ``timeout=5``, a body byte every 4.5 s (review: sync 9.0 s, async 5.0 s);
- ``drip-sse``: ``timeout=5``, an SSE byte every 4.5 s (review: sync 9.0 s, async 5.0 s);
- ``stream-bomb``: ``timeout=30``, a gzip-encoded stream of 4 GiB of tiny events
  (review: still running at 90 s, both clients);
- ``sse-decoder``: ``SSEDecoder().feed(b"\\n" * 1 MiB)`` (review: 4.4 s);
- ``bom``: a stream that starts with a UTF-8 byte order mark: events delivered
  of 2 (review: the first was dropped);
- ``key-echo``: a server echoes the API key in a non-JSON 200 body, in its
  content-type, in an SSE line and across the 500-character cut of an error
  body: places where the key shows in ``str``/``repr`` of the error (review: 4).

Server cases (``stormguard-server``, admission on, admin endpoint on):

- ``surrogate``: a lone surrogate as the model name on the chat, stream and
  ``/tokenize`` routes: answers that were a 500 (review: 3 of 3);
- ``admin-cross-site``: a ``text/plain`` POST of ``/admin/crash`` with no token,
  and ``GET /admin/faults`` with a foreign ``Host`` (DNS rebinding): how many
  were obeyed (review: 2 of 2);
- ``deadline-abort``: a streamed call with ``x-request-deadline-ms: 500`` and
  2,000 tokens to generate, read to its end: seconds until the server ends it
  (review: the server generated to the end).

A second review's cases (``bench/hostile_cases.py``), SDK first:

- ``abandoned-streams``: 60 streams read to their first chunk and dropped
  (``break``, then ``del``), then one plain call with ``timeout=5``: its seconds
  and outcome (review, async: every call after the 20th failed with
  ``QueueTimeoutError``, the limiter at limit 20, in flight 20, for good);
- ``stream-no-done``: 60 complete streams (every choice finished) whose body ends
  without ``data: [DONE]``, sync from 6 threads, async as 6 tasks (review: sync not
  done in 200 s); ``openai-no-done``: openai-python on ``stormguard.httpx_client``,
  10 such streams one after another (review: 25 s);
- ``poison-usage``, ``poison-quota``: a client of two endpoints sharing a
  ``TokenRateLimiter`` gets one answer with ``usage.total_tokens = 10**15``, or
  ``x-ratelimit-remaining-tokens: 0`` and a reset of 86,000 s: how many of the next 10
  calls are refused without leaving the client (review: 10 of 10);
- ``endpoint-churn``: 20,000 calls while a DNS name's 64 pods get new addresses every
  10 calls (fake resolver, mock transport, fake clock): the limiter's entries and the
  peak RSS (review: 18,228 entries for 64 live, RSS 32 -> 90 MB);
- ``fork``: a client used before ``os.fork()``; 6 children make 30 calls each, 4 at a
  time, while the parent calls too, against a server whose answer names its caller:
  child answers that were another process's (review: 7 of 180 sync; async: untyped
  ``RuntimeError``);
- ``loop-reuse``: one ``AsyncClient`` in one ``asyncio.run()`` after another against a
  keep-alive server: the second run's outcome (review: untyped ``RuntimeError``);
- ``close-in-flight``: ``close()`` while a call (``timeout=10``) waits for an answer
  that never comes: seconds from the close to the call's end (review, sync: not
  before its deadline);
- ``retry-after-skew``: 20 clients whose clocks run ahead are told to retry at an
  HTTP-date already past: distinct retry delays (review: one, 0 s);
- ``dns-huge``: a DNS answer of 32,768 addresses: CPU seconds of the call that reads
  it (review: 9 s);
- ``malformed-bodies``: ten 2xx bodies that break the API (``"choices": {"0": 1}``,
  ``null`` choices, ``Infinity`` or ``"3"`` token counts, ...): how many reach the
  caller, to fail at attribute access or hand on a wrong type, instead of failing
  the call typed (review: all of them);
- ``openai-non-sse``: openai-python on the transport asks for a stream and gets a
  JSON 200: what it raises (review: ``APIConnectionError: Connection error.``).

Server cases:

- ``big-head``: 3,000 headers (94.5 KiB) in one write: the status (review: accepted;
  ``bench/bench_slowloris.py --cases heads`` measures their memory and CPU);
- ``ambiguous-length``: Content-Length and Transfer-Encoding together: the status
  and whether the connection stays open (review: answered, kept open);
- ``late-priority``: 120 standard calls, then 60 ``x-priority: critical`` ones from
  a caller outside ``--trust-priority-from`` (loopback excluded; a server without
  the flag believes everyone): standard shed / critical served (review: 106 of
  120 / 60 of 60).

Slow clients (slowloris, idle connections, partial bodies) are measured by
``bench/bench_slowloris.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

import stormguard
from stormguard.tokens import TokenPolicy

# The hostile server lives with the tests that keep these cases as regressions.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.e2e.hostile_server import (
    HEAD_JSON,
    HEAD_SSE,
    HostileServer,
    RawRequest,
    answer,
    drip,
    gzip_bomb,
    head,
    never_answer,
)

import hostile_cases  # beside this script: the second review's cases

KEY = "sk-proj-Q3v9Xw2LrT8bYc1NfH6mKp0ZsD4gJ7aE5uVtR1yW"
MESSAGES = [{"role": "user", "content": "hello there"}]


@dataclass(frozen=True)
class Case:
    name: str
    modes: tuple[str, ...]
    unit: str
    before: str
    run: Callable[[str, float], Any]
    #: The call's own deadline, when it is long: the case gets that much more time.
    deadline: float = 0.0


def _client(mode: str, server: HostileServer, **options: Any) -> Any:
    cls = stormguard.Client if mode == "sync" else stormguard.AsyncClient
    options.setdefault("model", "m")
    options.setdefault("api_key", KEY)
    return cls(base_url=server.base_url, **options)


def _call(mode: str, client: Any, *, stream: bool = False) -> tuple[float, str]:
    """Seconds until the call returned or raised, and what it raised."""

    async def consume_async() -> None:
        result = await client.chat.completions.create(messages=MESSAGES, stream=stream)
        if stream:
            async for _ in result:
                pass

    def consume_sync() -> None:
        result = client.chat.completions.create(messages=MESSAGES, stream=stream)
        if stream:
            for _ in result:
                pass

    started = time.monotonic()
    outcome = "ok"
    try:
        if mode == "sync":
            consume_sync()
        else:
            asyncio.run(consume_async())
    except stormguard.StormguardError as exc:
        outcome = type(exc).__name__
    return time.monotonic() - started, outcome


def _timed(behaviours: dict[str, Any], mode: str, stream: bool = False, **options: Any) -> Any:
    with HostileServer(behaviours) as server:
        elapsed, outcome = _call(mode, _client(mode, server, **options), stream=stream)
    return {"value": round(elapsed, 2), "note": outcome}


def precheck_silent(mode: str, cap: float) -> Any:
    silent = never_answer()
    behaviours = {p: silent for p in ("/tokenize", "/v1/models", "/v1/chat/completions")}
    return _timed(behaviours, mode, timeout=0.5, token_policy=TokenPolicy())


def precheck_drip(mode: str, cap: float) -> Any:
    slow = drip(HEAD_JSON, interval=1.0)
    behaviours = {"/tokenize": slow, "/v1/models": slow, "/v1/chat/completions": slow}
    return _timed(behaviours, mode, timeout=2, token_policy=TokenPolicy())


def precheck_bomb(mode: str, cap: float) -> Any:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    bomb = gzip_bomb(1 << 30)
    behaviours = {"/tokenize": bomb, "/v1/models": bomb, "/v1/chat/completions": never_answer()}
    result = _timed(behaviours, mode, timeout=10, token_policy=TokenPolicy())
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    return {"value": round(grown, 1), "note": f"{result['note']} after {result['value']} s"}


def drip_headers(mode: str, cap: float) -> Any:
    return _timed({"/v1/chat/completions": drip(HEAD_JSON, interval=1.0)}, mode, timeout=2)


def drip_body(mode: str, cap: float) -> Any:
    prefix = head(200, [("content-type", "application/json"), ("content-length", "1000")])

    async def behaviour(request: RawRequest, writer: asyncio.StreamWriter) -> None:
        writer.write(prefix)
        await drip(b"", interval=4.5, then=b" ")(request, writer)

    return _timed({"/v1/chat/completions": behaviour}, mode, timeout=5)


def drip_sse(mode: str, cap: float) -> Any:
    async def behaviour(request: RawRequest, writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD_SSE)
        await drip(b"", interval=4.5, then=b":")(request, writer)

    return _timed({"/v1/chat/completions": behaviour}, mode, stream=True, timeout=5)


def stream_bomb(mode: str, cap: float) -> Any:
    event = b'data: {"choices":[]}\n\n'
    bomb = gzip_bomb(4 << 30, content_type="text/event-stream", unit=event)
    return _timed({"/v1/chat/completions": bomb}, mode, stream=True, timeout=30)


def sse_decoder(mode: str, cap: float) -> Any:
    from stormguard._io.sse import SSEDecoder

    started = time.perf_counter()
    SSEDecoder().feed(b"\n" * (1 << 20))
    return {"value": round(time.perf_counter() - started, 4), "note": ""}


def bom(mode: str, cap: float) -> Any:
    chunk = b'data: {"id":"c","object":"chat.completion.chunk","choices":[]}\n\n'
    body = b"\xef\xbb\xbf" + chunk * 2 + b"data: [DONE]\n\n"
    behaviours = {
        "/v1/chat/completions": answer(200, body, [("content-type", "text/event-stream")])
    }
    with HostileServer(behaviours) as server:
        client = _client(mode, server, timeout=5)
        if mode == "sync":
            got = len(list(client.chat.completions.create(messages=MESSAGES, stream=True)))
        else:

            async def count() -> int:
                stream = await client.chat.completions.create(messages=MESSAGES, stream=True)
                return len([c async for c in stream])

            got = asyncio.run(count())
    return {"value": got, "note": "of 2"}


def _echo(kind: str) -> Any:
    async def behaviour(request: RawRequest, writer: asyncio.StreamWriter) -> None:
        key = request.headers.get("authorization", "").removeprefix("Bearer ")
        if kind == "body":
            raw = head(200, [("content-type", "application/json")]) + f"oops {key}".encode()
        elif kind == "content-type":
            raw = head(200, [("content-type", f"text/{key}")]) + b"{}"
        elif kind == "sse":
            raw = HEAD_SSE + f"not json {key}\n\ndata: {key}\n\n".encode()
        else:  # straddle: the key across the 500-character cut of an error body
            raw = head(500, [("content-type", "text/plain")]) + ("x" * 490 + key).encode()
        writer.write(raw)
        await writer.drain()
        writer.close()

    return behaviour


def key_echo(mode: str, cap: float) -> Any:
    leaks = 0
    for kind in ("body", "content-type", "sse", "straddle"):
        behaviours = {"/v1/chat/completions": _echo(kind)}
        with HostileServer(behaviours) as server:
            client = _client(
                mode, server, timeout=5, retry_policy=stormguard.RetryPolicy(max_attempts=1)
            )
            try:
                if mode == "sync":
                    result = client.chat.completions.create(messages=MESSAGES, stream=kind == "sse")
                    if kind == "sse":
                        list(result)
                else:

                    async def run(client: Any = client, kind: str = kind) -> None:
                        result = await client.chat.completions.create(
                            messages=MESSAGES, stream=kind == "sse"
                        )
                        if kind == "sse":
                            async for _ in result:
                                pass

                    asyncio.run(run())
            except stormguard.StormguardError as exc:
                text = f"{exc} {exc!r}"
                leaks += any(KEY[i : i + 8] in text for i in range(len(KEY) - 7))
    return {"value": leaks, "note": "of 4"}


# -- the reference server --------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class _Server:
    """``stormguard-server`` with its admin endpoint, on free loopback ports."""

    def __init__(self) -> None:
        self.port, self.admin_port = _free_port(), _free_port()
        self.token = os.urandom(16).hex()
        command = [
            sys.executable, "-m", "stormguard_server", "--port", str(self.port),
            "--admin-port", str(self.admin_port), "--log-level", "warning",
        ]  # fmt: skip
        env = {**os.environ, "STORMGUARD_ADMIN_TOKEN": self.token}
        self.process = subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url("/ready"), timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("stormguard-server did not become ready")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def surrogate(mode: str, cap: float) -> Any:
    server = _Server()
    try:
        model = '"\\ud800"'  # a lone surrogate, as a JSON escape
        messages = '[{"role":"user","content":"hi"}]'
        bodies = {
            "chat": ("/v1/chat/completions", f'{{"model":{model},"messages":{messages}}}'),
            "stream": (
                "/v1/chat/completions",
                f'{{"model":{model},"messages":{messages},"stream":true}}',
            ),
            "tokenize": ("/tokenize", f'{{"model":{model},"prompt":"hi"}}'),
        }
        statuses = {}
        for name, (path, body) in bodies.items():
            response = httpx.post(
                server.url(path), content=body, headers={"content-type": "application/json"}
            )
            statuses[name] = response.status_code
    finally:
        server.stop()
    fives = sum(status >= 500 for status in statuses.values())
    return {"value": fives, "note": f"of 3 {statuses}"}


def admin_cross_site(mode: str, cap: float) -> Any:
    server = _Server()
    admin = f"http://127.0.0.1:{server.admin_port}"
    try:
        crash = httpx.post(
            f"{admin}/admin/crash",
            content=b"x",
            headers={"content-type": "text/plain", "origin": "http://evil.example"},
        )
        rebind = httpx.get(f"{admin}/admin/faults", headers={"host": "evil.example"})
    finally:
        server.stop()
    obeyed = (crash.status_code == 200) + (rebind.status_code == 200)
    return {"value": obeyed, "note": f"of 2 (crash {crash.status_code}, {rebind.status_code})"}


def deadline_abort(mode: str, cap: float) -> Any:
    server = _Server()
    body = {
        "model": "stormguard-sim",
        "messages": MESSAGES,
        "max_tokens": 2000,
        "ignore_eos": True,
        "stream": True,
    }
    try:
        started = time.monotonic()
        with httpx.stream(
            "POST",
            server.url("/v1/chat/completions"),
            json=body,
            headers={"x-request-deadline-ms": "500"},
            timeout=cap,
        ) as response:
            for _ in response.iter_bytes():
                pass
        elapsed = time.monotonic() - started
    finally:
        server.stop()
    return {"value": round(elapsed, 2), "note": f"status {response.status_code}"}


CASES = [
    Case("precheck-silent", ("sync", "async"), "s", "4.0 s", precheck_silent),
    Case("precheck-drip", ("sync", "async"), "s", ">= 60 s", precheck_drip),
    Case("precheck-bomb", ("sync", "async"), "MB RSS", "3,100 MB", precheck_bomb),
    Case("drip-headers", ("sync", "async"), "s", "sync >= 120 s, async 2.02 s", drip_headers),
    Case("drip-body", ("sync", "async"), "s", "sync 9.0 s, async 5.0 s", drip_body),
    Case("drip-sse", ("sync", "async"), "s", "sync 9.0 s, async 5.0 s", drip_sse),
    Case("stream-bomb", ("sync", "async"), "s", ">= 90 s", stream_bomb, deadline=30.0),
    Case("sse-decoder", ("-",), "s", "4.4 s", sse_decoder),
    Case("bom", ("sync", "async"), "events", "1 of 2", bom),
    Case("key-echo", ("sync", "async"), "leaks", "4 of 4", key_echo),
    Case("surrogate", ("-",), "500s", "3 of 3", surrogate),
    Case("admin-cross-site", ("-",), "obeyed", "2 of 2", admin_cross_site),
    Case("deadline-abort", ("-",), "s", "to the end", deadline_abort),
    # The second review's (bench/hostile_cases.py).
    Case(
        "abandoned-streams",
        ("sync", "async"),
        "s",
        "async: QueueTimeoutError",
        hostile_cases.abandoned_streams,
        deadline=10.0,
    ),
    Case(
        "stream-no-done",
        ("sync", "async"),
        "s",
        "sync >= 200 s",
        hostile_cases.stream_without_done,
        deadline=30.0,
    ),
    Case("openai-no-done", ("-",), "s", "25 s", hostile_cases.openai_without_done, deadline=30.0),
    Case("poison-usage", ("sync", "async"), "refused", "10 of 10", hostile_cases.poison_usage),
    Case("poison-quota", ("sync", "async"), "refused", "10 of 10", hostile_cases.poison_quota),
    Case(
        "endpoint-churn",
        ("-",),
        "entries",
        "18,228 for 64; 32 -> 90 MB",
        hostile_cases.endpoint_churn,
        deadline=60.0,
    ),
    Case(
        "fork",
        ("sync", "async"),
        "wrong",
        "7 of 180; async RuntimeError",
        hostile_cases.fork,
        deadline=40.0,
    ),
    Case("loop-reuse", ("-",), "outcome", "RuntimeError", hostile_cases.loop_reuse),
    Case(
        "close-in-flight",
        ("sync", "async"),
        "s",
        "sync: at its deadline",
        hostile_cases.close_in_flight,
        deadline=10.0,
    ),
    Case(
        "retry-after-skew", ("sync", "async"), "delays", "1 (0 s)", hostile_cases.retry_after_skew
    ),
    Case("dns-huge", ("-",), "CPU s", "9 s", hostile_cases.dns_huge, deadline=30.0),
    Case(
        "malformed-bodies", ("sync", "async"), "untyped", "10 of 10", hostile_cases.malformed_bodies
    ),
    Case(
        "openai-non-sse",
        ("sync", "async"),
        "raises",
        "APIConnectionError",
        hostile_cases.openai_non_sse,
    ),
    Case("big-head", ("-",), "status", "accepted", hostile_cases.big_head),
    Case(
        "ambiguous-length", ("-",), "status", "answered, kept open", hostile_cases.ambiguous_length
    ),
    Case("late-priority", ("-",), "shed/served", "106 / 60", hostile_cases.late_priority),
]
_BY_NAME = {case.name: case for case in CASES}


def _run_in_child(case: Case, mode: str, cap: float) -> dict[str, Any]:
    cap += case.deadline
    command = [sys.executable, __file__, "--child", case.name, mode, str(cap)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=cap)
    except subprocess.TimeoutExpired:
        return {"value": f">= {cap:g}", "note": "still blocked at the cap"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"value": "error", "note": done.stderr.strip().splitlines()[-1:]}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="*", choices=list(_BY_NAME), default=list(_BY_NAME))
    parser.add_argument(
        "--cap", type=float, default=30.0, help="seconds past its call's deadline a case is cut"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        name, mode, cap = args.child
        print(json.dumps(_BY_NAME[name].run(mode, float(cap))), flush=True)
        return
    rows = []
    print(f"{'case':<18} {'mode':<6} {'now':>12} {'unit':<7} {'review':<30} note")
    for name in args.cases:
        case = _BY_NAME[name]
        for mode in case.modes:
            result = _run_in_child(case, mode, args.cap)
            rows.append({"case": name, "mode": mode, "unit": case.unit, **result})
            print(
                f"{name:<18} {mode:<6} {result['value']!s:>12} {case.unit:<7} "
                f"{case.before:<30} {result['note']}",
                flush=True,
            )
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
