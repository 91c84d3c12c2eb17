"""The cases of ``bench_hostile.py`` that a second adversarial review added: shared
state one answer or one careless caller can wedge, a client across forks, event
loops and a close, odd bodies, and the reference server's framing and priorities.

Each function takes ``(mode, cap)`` and returns ``{"value": ..., "note": ...}``, as
``bench_hostile.py``'s own cases do, and runs in a process of its own. Each uses
only options the SDK had before its fix and reports any exception by its class
(marked "untyped" when it is no ``StormguardError``), so the same script measures
the code before the fixes and after; a server flag the old server lacks is left
out and said so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import multiprocessing
import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

import stormguard
from stormguard.testing import FakeClock
from stormguard.tokens import TokenPolicy, TokenRateLimiter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.e2e.echo_server import answer_of, run_echo_server
from tests.e2e.hostile_client import hold, many_headers_head, open_held
from tests.e2e.hostile_server import HEAD_SSE, HostileServer, RawRequest, answer, never_answer
from tests.e2e.server_process import RunningServer, run_server

KEY = "sk-proj-Q3v9Xw2LrT8bYc1NfH6mKp0ZsD4gJ7aE5uVtR1yW"
MESSAGES = [{"role": "user", "content": "hello there"}]
SSE = [("content-type", "text/event-stream")]

Result = dict[str, Any]


def _completion(content: str = "pong", **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
    body.update(fields)
    return body


def _chunk(content: str, finish: str | None = None) -> str:
    choices = [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]
    body = {"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": choices}
    return f"data: {json.dumps(body)}\n\n"


def _outcome(error: BaseException | None) -> str:
    """``ok``, or the error's class, marked when it is not a StormguardError."""
    if error is None:
        return "ok"
    name = type(error).__name__
    return name if isinstance(error, stormguard.StormguardError) else f"{name} (untyped)"


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- streams left unclosed ----------------------------------------------------------------


def _endless_stream_or_answer() -> Any:
    """A stream that sends one chunk and then nothing, for good; a plain call's answer."""
    plain = answer(200, _completion())

    async def behaviour(request: RawRequest, writer: asyncio.StreamWriter) -> None:
        if request.json().get("stream"):
            writer.write(HEAD_SSE + _chunk("a").encode())
            await writer.drain()
            await asyncio.Event().wait()
        else:
            await plain(request, writer)

    return behaviour


def abandoned_streams(mode: str, cap: float) -> Result:
    """60 streams read to their first chunk and dropped, then one plain call."""
    left = 60
    with HostileServer({"/v1/chat/completions": _endless_stream_or_answer()}) as server:
        options: dict[str, Any] = {"base_url": server.base_url, "model": "m", "api_key": KEY}
        opened, failed, took, outcome = 0, "", 0.0, ""
        if mode == "sync":
            client = stormguard.Client(**options, timeout=5)
            for _ in range(left):
                try:
                    stream = client.chat.completions.create(messages=MESSAGES, stream=True)
                except stormguard.StormguardError as exc:
                    failed = type(exc).__name__
                    break
                for _chunk_read in stream:
                    break
                del stream
                opened += 1
            started = time.monotonic()
            error: BaseException | None = None
            try:
                client.chat.completions.create(messages=MESSAGES, timeout=5)
            except Exception as exc:
                error = exc
            took, outcome = time.monotonic() - started, _outcome(error)
        else:

            async def run() -> tuple[Any, float, str]:
                nonlocal opened, failed
                client = stormguard.AsyncClient(**options, timeout=5)
                for _ in range(left):
                    try:
                        stream = await client.chat.completions.create(
                            messages=MESSAGES, stream=True
                        )
                    except stormguard.StormguardError as exc:
                        failed = type(exc).__name__
                        break
                    async for _chunk_read in stream:
                        break
                    del stream
                    opened += 1
                started = time.monotonic()
                error: BaseException | None = None
                try:
                    await client.chat.completions.create(messages=MESSAGES, timeout=5)
                except Exception as exc:
                    error = exc
                return client, time.monotonic() - started, _outcome(error)

            client, took, outcome = asyncio.run(run())
        limits = client.stats().concurrency
        state = f"limit {limits[0].limit}, in flight {limits[0].in_flight}" if limits else ""
    stopped = f"; stream {opened + 1} failed {failed}" if failed else ""
    return {
        "value": round(took, 3),
        "note": f"{outcome}; {opened} of {left} streams opened{stopped}; {state}",
    }


# -- complete streams without [DONE] --------------------------------------------------------

_COMPLETE = _chunk("hel") + _chunk("lo", "stop")  # every choice finished; no [DONE]


def stream_without_done(mode: str, cap: float) -> Result:
    """60 complete streams without ``[DONE]``: sync from 6 threads, async as 6 tasks."""
    with HostileServer({"/v1/chat/completions": answer(200, _COMPLETE, SSE)}) as server:
        limiter = stormguard.ConcurrencyLimiter(initial_limit=4)
        options: dict[str, Any] = {"base_url": server.base_url, "model": "m", "api_key": KEY}
        options.update(timeout=30, concurrency=limiter)
        errors: list[str] = []
        started = time.monotonic()
        if mode == "sync":
            with stormguard.Client(**options) as client:

                def call(_: int) -> None:
                    try:
                        stream = client.chat.completions.create(messages=MESSAGES, stream=True)
                        "".join(c.choices[0].delta.content for c in stream)
                    except stormguard.StormguardError as exc:
                        errors.append(type(exc).__name__)

                with ThreadPoolExecutor(6) as pool:
                    list(pool.map(call, range(60)))
        else:

            async def run() -> None:
                async with stormguard.AsyncClient(**options) as client:

                    async def calls() -> None:
                        for _ in range(10):
                            try:
                                stream = await client.chat.completions.create(
                                    messages=MESSAGES, stream=True
                                )
                                async for _chunk_read in stream:
                                    pass
                            except stormguard.StormguardError as exc:
                                errors.append(type(exc).__name__)

                    await asyncio.gather(*(calls() for _ in range(6)))

            asyncio.run(run())
        took = time.monotonic() - started
    kinds = sorted(set(errors))
    return {"value": round(took, 2), "note": f"{len(errors)} of 60 failed {kinds or ''}".strip()}


def openai_without_done(mode: str, cap: float) -> Result:
    """openai-python over stormguard's transport: 10 complete streams without [DONE]."""
    import openai

    with HostileServer({"/v1/chat/completions": answer(200, _COMPLETE, SSE)}) as server:
        limiter = stormguard.ConcurrencyLimiter(initial_limit=4)
        url = server.base_url
        http = stormguard.httpx_client(base_url=url, model="m", timeout=30, concurrency=limiter)
        texts = []
        started = time.monotonic()
        with openai.OpenAI(base_url=url, api_key=KEY, http_client=http, max_retries=0) as oai:
            for _ in range(10):
                stream = oai.chat.completions.create(model="m", messages=MESSAGES, stream=True)
                texts.append("".join(c.choices[0].delta.content or "" for c in stream))
        took = time.monotonic() - started
    return {"value": round(took, 2), "note": f"{texts.count('hello')} of 10 read whole"}


# -- one answer poisons a shared token limiter ---------------------------------------------


def _poisoning(poison: bytes) -> tuple[Any, list[str]]:
    """A behaviour whose first answer is ``poison`` (raw), every later one a plain
    completion; and the list of the ports that got the poison."""
    healthy = answer(200, _completion())
    poisoned: list[str] = []
    lock = threading.Lock()

    async def behaviour(request: RawRequest, writer: asyncio.StreamWriter) -> None:
        with lock:
            first = not poisoned
            if first:
                poisoned.append(request.headers.get("host", ""))
        if first:
            writer.write(poison)
            await writer.drain()
        else:
            await healthy(request, writer)

    return behaviour, poisoned


def _framed(status: int, body: dict[str, Any], headers: list[tuple[str, str]]) -> bytes:
    from tests.e2e.hostile_server import head

    payload = json.dumps(body).encode()
    framing = [("content-type", "application/json"), ("content-length", str(len(payload)))]
    return head(status, [*headers, *framing, ("connection", "close")]) + payload


def _poisoned_limiter(mode: str, poison: bytes) -> Result:
    """A client of two endpoints sharing a token rate limiter; whichever gets the first
    call answers it with ``poison``. How many of the next 10 calls never leave the
    client (refused by the limiter), and how many are served."""
    behaviour, poisoned = _poisoning(poison)
    paths = {"/v1/chat/completions": behaviour}
    with HostileServer(paths) as a, HostileServer(paths) as b:
        bucket = TokenRateLimiter(tokens_per_minute=600_000)
        policy = TokenPolicy(
            server_context_windows=False, server_tokenize=False, rate_limiter=bucket
        )
        options: dict[str, Any] = {"base_url": [a.base_url, b.base_url], "model": "m"}
        options.update(api_key=KEY, token_policy=policy, timeout=5)
        refused: list[str] = []
        served = 0

        def asked() -> int:
            return len(a.requests) + len(b.requests)

        def failed(exc: BaseException, before: int) -> None:
            if asked() == before:  # it never left the client
                refused.append(str(exc))

        if mode == "sync":
            client = stormguard.Client(**options)
            with contextlib.suppress(stormguard.StormguardError):
                client.chat.completions.create(messages=MESSAGES, max_tokens=5)  # the poison
            for _ in range(10):
                before = asked()
                try:
                    client.chat.completions.create(messages=MESSAGES, max_tokens=5)
                except stormguard.StormguardError as exc:
                    failed(exc, before)
                else:
                    served += 1
            client.close()
        else:

            async def run() -> None:
                nonlocal served
                client = stormguard.AsyncClient(**options)
                with contextlib.suppress(stormguard.StormguardError):
                    await client.chat.completions.create(messages=MESSAGES, max_tokens=5)
                for _ in range(10):
                    before = asked()
                    try:
                        await client.chat.completions.create(messages=MESSAGES, max_tokens=5)
                    except stormguard.StormguardError as exc:
                        failed(exc, before)
                    else:
                        served += 1
                await client.close()

            asyncio.run(run())
    if not poisoned:
        return {"value": "error", "note": "no answer was poisoned"}
    said = f"; {refused[0][:90]}" if refused else ""
    return {"value": len(refused), "note": f"of 10 refused locally, {served} served{said}"}


def poison_usage(mode: str, cap: float) -> Result:
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 10**15}
    return _poisoned_limiter(mode, _framed(200, _completion(usage=usage), []))


def poison_quota(mode: str, cap: float) -> Result:
    spent = [("x-ratelimit-remaining-tokens", "0"), ("x-ratelimit-reset-tokens", "86000s")]
    return _poisoned_limiter(mode, _framed(200, _completion(), spent))


# -- endpoint churn -------------------------------------------------------------------------


class _Deploys:
    """A DNS name whose 64 pods get new addresses at every deploy (every look)."""

    def __init__(self) -> None:
        self.deploys = 0

    def __call__(self, host: str, port: int) -> list[str]:
        self.deploys += 1
        base = self.deploys * 64
        return [
            f"10.{(base + i) // 65536 % 256}.{(base + i) // 256 % 256}.{(base + i) % 256}"
            for i in range(64)
        ]


def _unreachable(host: str, port: int, timeout: float) -> bool:
    return False  # a connect check that makes no connection: the hosts do not exist


def _mock_http(mode: str, handler: Callable[[httpx.Request], httpx.Response]) -> Any:
    transport = httpx.MockTransport(handler)
    return (
        httpx.Client(transport=transport)
        if mode == "sync"
        else httpx.AsyncClient(transport=transport)
    )


def endpoint_churn(mode: str, cap: float) -> Result:
    """20,000 calls while the name's 64 pods get new addresses every 10 calls (a fake
    resolver, a mock transport, a fake clock): the limiter's entries and peak RSS."""
    clock = FakeClock()
    body = _completion()
    http = _mock_http("sync", lambda request: httpx.Response(200, json=body))
    client = stormguard.Client(
        base_url="dns+http://vllm.ns.svc:8000/v1",
        model="m",
        api_key=KEY,
        clock=clock,
        http_client=http,
        discovery=stormguard.DiscoveryConfig(
            resolver=_Deploys(), executor=lambda look: look(), refresh_interval=5.0
        ),
        ejection=stormguard.EjectionConfig(probe=_unreachable),
    )
    for _ in range(100):  # warm: imports, first allocations
        client.chat.completions.create(messages=MESSAGES)
    rss_before = _rss_mb()
    started = time.monotonic()
    for i in range(20_000):
        client.chat.completions.create(messages=MESSAGES)
        if i % 10 == 9:
            clock.advance(5.0)  # the next call looks again, and finds the next deploy
    took = time.monotonic() - started
    limiter = client.concurrency
    entries = len(limiter.state()) if limiter is not None else 0
    stats = client.stats()
    live = len(stats.endpoint_names)
    client.close()
    return {
        "value": entries,
        "note": f"for {live} live; breakers {len(stats.breakers)}; "
        f"peak RSS {rss_before:.0f} -> {_rss_mb():.0f} MB; {took:.1f} s",
    }


# -- a client used before a fork ---------------------------------------------------------

CHILDREN, CHILD_CALLS = 6, 30  # 180 child answers


def _tally() -> dict[str, Any]:
    return {"pid": os.getpid(), "answers": 0, "wrong": 0, "errors": [], "ports": set()}


def _record(tally: dict[str, Any], tag: str, content: str | None) -> None:
    got, port = answer_of(content)
    tally["answers"] += 1
    tally["ports"].add(port)
    if got != tag:
        tally["wrong"] += 1


def _sync_calls(client: Any, count: int) -> dict[str, Any]:
    tally = _tally()

    def call(index: int) -> None:
        tag = f"{os.getpid()}-{index}"
        try:
            result = client.chat.completions.create(
                messages=MESSAGES, extra_headers={"x-caller": tag}
            )
        except Exception as exc:
            tally["errors"].append(_outcome(exc))
        else:
            _record(tally, tag, result.choices[0].message.content)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(call, range(count)))
    return tally


async def _async_calls(client: Any, count: int) -> dict[str, Any]:
    tally = _tally()

    async def call(index: int) -> None:
        tag = f"{os.getpid()}-{index}"
        try:
            result = await client.chat.completions.create(
                messages=MESSAGES, extra_headers={"x-caller": tag}
            )
        except Exception as exc:
            tally["errors"].append(_outcome(exc))
        else:
            _record(tally, tag, result.choices[0].message.content)

    for start in range(0, count, 4):
        await asyncio.gather(*(call(i) for i in range(start, min(start + 4, count))))
    return tally


def _child(mode: str, client: Any, results: Any) -> None:
    try:
        if mode == "sync":
            tally = _sync_calls(client, CHILD_CALLS)
        else:
            tally = asyncio.run(_async_calls(client, CHILD_CALLS))
    except BaseException as exc:  # the child's run itself failed: say how
        tally = {**_tally(), "errors": [_outcome(exc)] * CHILD_CALLS}
    results.put(tally)


def _collect(children: list[Any], results: Any, deadline: float) -> list[dict[str, Any]]:
    tallies = []
    for _ in children:
        try:
            tallies.append(results.get(timeout=max(0.1, deadline - time.monotonic())))
        except Exception:
            break
    for child in children:
        child.join(max(0.1, deadline - time.monotonic()))
        if child.is_alive():
            child.kill()
            child.join()
    return tallies


def _fork_summary(parent: dict[str, Any], tallies: list[dict[str, Any]]) -> Result:
    answers = sum(t["answers"] for t in tallies)
    wrong = sum(t["wrong"] for t in tallies)
    errors = [e for t in tallies for e in t["errors"]]
    hung = CHILDREN - len(tallies)
    shared = sum(bool(t["ports"] & parent["ports"]) for t in tallies)
    kinds = sorted(set(errors))
    return {
        "value": wrong,
        "note": f"of {answers} child answers were another's; {len(errors)} errors {kinds}; "
        f"{hung} children hung; parent {parent['wrong']} wrong, {len(parent['errors'])} errors;"
        f" {shared} children on the parent's connections",
    }


def fork(mode: str, cap: float) -> Result:
    """A client used before ``os.fork()``: 6 children (30 calls each, 4 at a time) and
    the parent call at once; whose answers each read."""
    context = multiprocessing.get_context("fork")
    with run_echo_server() as echo:
        options: dict[str, Any] = {"base_url": echo.base_url, "model": "m", "api_key": KEY}
        results = context.Queue()
        if mode == "sync":
            client = stormguard.Client(**options, timeout=10)
            _sync_calls(client, 8)  # the pool now holds idle connections to hand on
            children = [
                context.Process(target=_child, args=(mode, client, results))
                for _ in range(CHILDREN)
            ]
            for child in children:
                child.start()
            parent = _sync_calls(client, CHILD_CALLS)
            tallies = _collect(children, results, time.monotonic() + cap - 5)
        else:

            async def run() -> tuple[dict[str, Any], list[dict[str, Any]]]:
                client = stormguard.AsyncClient(**options, timeout=10)
                await _async_calls(client, 8)
                children = [
                    context.Process(target=_child, args=(mode, client, results))
                    for _ in range(CHILDREN)
                ]
                for child in children:
                    child.start()  # from inside the running loop: each child runs its own
                parent = await _async_calls(client, CHILD_CALLS)
                deadline = time.monotonic() + cap - 5
                tallies = await asyncio.to_thread(_collect, children, results, deadline)
                return parent, tallies

            parent, tallies = asyncio.run(run())
    return _fork_summary(parent, tallies)


# -- event loops and close ----------------------------------------------------------------


def loop_reuse(mode: str, cap: float) -> Result:
    """One AsyncClient, one ``asyncio.run()`` after another (a keep-alive server)."""
    outcomes = []
    with run_echo_server() as echo:
        client = stormguard.AsyncClient(base_url=echo.base_url, model="m", api_key=KEY, timeout=10)

        async def call(tag: str) -> None:
            result = await client.chat.completions.create(
                messages=MESSAGES, extra_headers={"x-caller": tag}
            )
            assert answer_of(result.choices[0].message.content)[0] == tag

        for run in range(3):
            error: BaseException | None = None
            try:
                asyncio.run(call(f"run-{run}"))
            except Exception as exc:
                error = exc
            outcomes.append(_outcome(error))
    return {"value": outcomes[1], "note": f"runs: {', '.join(outcomes)}"}


def _wait_until(condition: Callable[[], object], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the condition never held")
        time.sleep(0.005)


def close_in_flight(mode: str, cap: float) -> Result:
    """``close()`` while a call waits for an answer that never comes (``timeout=10``):
    seconds from the close to the call's end, and how it ended."""
    deadline = 10.0
    with HostileServer({"/v1/chat/completions": never_answer()}) as server:
        options: dict[str, Any] = {"base_url": server.base_url, "model": "m", "api_key": KEY}
        options.update(timeout=deadline, max_retries=3)
        ended: list[BaseException | None] = []
        if mode == "sync":
            client = stormguard.Client(**options)

            def call() -> None:
                try:
                    client.chat.completions.create(messages=MESSAGES)
                    ended.append(None)
                except BaseException as exc:
                    ended.append(exc)

            thread = threading.Thread(target=call)
            thread.start()
            _wait_until(lambda: server.requests)  # the call now waits for its answer
            closing = time.monotonic()
            client.close()
            thread.join(deadline + cap)
            took = time.monotonic() - closing
        else:

            async def run() -> float:
                client = stormguard.AsyncClient(**options)

                async def call() -> None:
                    try:
                        await client.chat.completions.create(messages=MESSAGES)
                        ended.append(None)
                    except BaseException as exc:
                        ended.append(exc)

                task = asyncio.create_task(call())
                await asyncio.to_thread(_wait_until, lambda: server.requests)
                closing = time.monotonic()
                await client.close()
                await asyncio.wait_for(task, deadline + cap)
                return time.monotonic() - closing

            took = asyncio.run(run())
        requests = len(server.requests)
    outcome = _outcome(ended[0]) if ended else "still running"
    return {"value": round(took, 3), "note": f"{outcome}; {requests} request(s) sent"}


# -- Retry-After as an HTTP-date, under clock skew ------------------------------------------


def retry_after_skew(mode: str, cap: float) -> Result:
    """20 clients whose clocks run ahead of the server's are told to retry at a moment
    already past (no Date header): the delays they wait before their retries."""
    import email.utils

    past = email.utils.formatdate(time.time() - 30, usegmt=True)
    delays = []
    for _ in range(20):
        answers = iter(
            [
                httpx.Response(
                    503, json={"error": {"message": "busy"}}, headers={"retry-after": past}
                ),
                httpx.Response(200, json=_completion()),
            ]
        )
        http = _mock_http(mode, lambda request, answers=answers: next(answers))
        options: dict[str, Any] = {"base_url": "http://llm.test/v1", "model": "m"}
        options.update(api_key=KEY, clock=FakeClock(), concurrency=None, http_client=http)
        if mode == "sync":
            client = stormguard.Client(**options)
            result = client.chat.completions.create(messages=MESSAGES)
            client.close()
        else:

            async def run(options: dict[str, Any] = options) -> Any:
                client = stormguard.AsyncClient(**options)
                result = await client.chat.completions.create(messages=MESSAGES)
                await client.close()
                return result

            result = asyncio.run(run())
        delays.append(result.attempt_history[1].delay_before)
    return {
        "value": len(set(delays)),
        "note": f"distinct of 20; delays {min(delays):.3f} to {max(delays):.3f} s",
    }


# -- a DNS answer of 32,768 addresses -------------------------------------------------------


def dns_huge(mode: str, cap: float) -> Result:
    """A resolver that answers 32,768 distinct addresses: CPU seconds of the first call
    (the look reads the answer)."""
    import logging

    logging.getLogger("stormguard").setLevel(logging.ERROR)  # the cap's warning
    many = [f"10.{i // 65536}.{i // 256 % 256}.{i % 256}" for i in range(32_768)]
    http = _mock_http("sync", lambda request: httpx.Response(200, json=_completion()))
    started = time.process_time()
    client = stormguard.Client(
        base_url="dns+http://vllm.ns.svc:8000/v1",
        model="m",
        api_key=KEY,
        http_client=http,
        discovery=stormguard.DiscoveryConfig(
            resolver=lambda host, port: many, executor=lambda look: look()
        ),
        ejection=stormguard.EjectionConfig(probe=_unreachable),
    )
    client.chat.completions.create(messages=MESSAGES)
    cpu = time.process_time() - started
    kept = len(client.stats().endpoint_names)
    client.close()
    return {"value": round(cpu, 3), "note": f"{kept} endpoints kept"}


# -- 2xx bodies the records cannot serve ----------------------------------------------------

#: Fields laid over a valid completion (as tests/sdk/core/test_record_shapes.py's BAD_CHAT).
BAD_BODIES: dict[str, dict[str, Any]] = {
    "choices an object": {"choices": {"0": 1}},
    "choices null": {"choices": None},
    "a choice a number": {"choices": [1]},
    "a message a string": {"choices": [{"index": 0, "message": "hi"}]},
    "content a number": {"choices": [{"index": 0, "message": {"content": 5}}]},
    "tokens Infinity": {"usage": {"total_tokens": math.inf}},
    "tokens a string": {"usage": {"prompt_tokens": "3"}},
    "tokens a fraction": {"usage": {"completion_tokens": 2.5}},
    "created a boolean": {"created": True},
    "a tool call's function a list": {
        "choices": [{"message": {"tool_calls": [{"id": "t", "function": []}]}}]
    },
}


def _read_every_field(result: Any) -> list[str]:
    """Read every documented field of a chat completion as a caller would; the ones
    whose value is not of its documented type."""
    wrong = []

    def check(name: str, value: Any, kind: type | tuple[type, ...]) -> None:
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            wrong.append(name)

    check("id", result.id, str)
    check("created", result.created, int)
    check("model", result.model, str)
    for choice in result.choices:  # as a caller reads them: a list
        check("index", choice.index, int)
        check("finish_reason", choice.finish_reason, str)
        message = choice.message
        check("content", message.content, str)
        check("role", message.role, str)
        for call in message.tool_calls or []:
            check("tool_call.id", call.id, str)
            check("function.name", call.function.name, str)
            check("function.arguments", call.function.arguments, str)
    usage = result.usage
    if usage is not None:
        for field in ("prompt_tokens", "completion_tokens", "total_tokens"):
            check(field, getattr(usage, field), int)
    return wrong


def malformed_bodies(mode: str, cap: float) -> Result:
    """Ten 2xx bodies whose fields break the API: how many fail at the call with a
    typed error; how many reach the caller, to fail at attribute access (or to hand
    on a value of the wrong type)."""
    bodies = {
        name: json.dumps(_completion(**fields)).encode() for name, fields in BAD_BODIES.items()
    }
    names = list(bodies)

    async def behaviour(request: RawRequest, writer: asyncio.StreamWriter) -> None:
        name = names[int(request.json()["model"].removeprefix("case-"))]
        await answer(200, bodies[name], [("content-type", "application/json")])(request, writer)

    typed, at_access, silent = [], [], []
    with HostileServer({"/v1/chat/completions": behaviour}) as server:
        options: dict[str, Any] = {"base_url": server.base_url, "api_key": KEY, "timeout": 5}
        options.update(max_retries=0)
        client: Any = (stormguard.Client if mode == "sync" else stormguard.AsyncClient)(
            model="case-0", **options
        )
        for index, name in enumerate(names):
            try:
                call = client.chat.completions.create(messages=MESSAGES, model=f"case-{index}")
                result = call if mode == "sync" else asyncio.run(call)
            except stormguard.StormguardError:
                typed.append(name)
                continue
            try:
                wrong = _read_every_field(result)
            except Exception as exc:
                at_access.append(f"{name}: {type(exc).__name__}")
                continue
            if wrong:
                silent.append(f"{name}: {', '.join(wrong)}")
    untyped = len(at_access) + len(silent)
    note = f"of {len(names)} reach the caller; {len(typed)} fail at the call, typed"
    if at_access:
        note += f"; at access: {'; '.join(at_access)}"
    if silent:
        note += f"; wrong types handed on: {'; '.join(silent)}"
    return {"value": untyped, "note": note}


def openai_non_sse(mode: str, cap: float) -> Result:
    """openai-python over stormguard's transport asks for a stream and gets a JSON 200:
    what it raises."""
    import openai

    completion = {"id": "c", "object": "chat.completion", "model": "m", "choices": []}
    with HostileServer({"/v1/chat/completions": answer(200, completion)}) as server:
        url = server.base_url
        error: BaseException | None = None
        if mode == "sync":
            http = stormguard.httpx_client(base_url=url, model="m", timeout=30)
            with openai.OpenAI(base_url=url, api_key=KEY, http_client=http, max_retries=0) as oai:
                try:
                    list(oai.chat.completions.create(model="m", messages=MESSAGES, stream=True))
                except Exception as exc:
                    error = exc
        else:

            async def run() -> BaseException | None:
                http = stormguard.async_httpx_client(base_url=url, model="m", timeout=30)
                async with openai.AsyncOpenAI(
                    base_url=url, api_key=KEY, http_client=http, max_retries=0
                ) as oai:
                    try:
                        stream = await oai.chat.completions.create(
                            model="m", messages=MESSAGES, stream=True
                        )
                        async for _chunk_read in stream:
                            pass
                    except Exception as exc:
                        return exc
                return None

            error = asyncio.run(run())
        sent = len(server.requests)
    if error is None:
        return {"value": "no error", "note": f"{sent} request(s)"}
    message = " ".join(str(error).split())[:110]
    return {"value": type(error).__name__, "note": f"{message}; {sent} request(s)"}


# -- the reference server ------------------------------------------------------------------


def _chat_body() -> bytes:
    return json.dumps({"model": "stormguard-sim", "messages": MESSAGES, "max_tokens": 2}).encode()


def _error_code(body: bytes) -> str:
    with contextlib.suppress(ValueError, TypeError, AttributeError, KeyError):
        return str(json.loads(body)["error"].get("code") or "")
    return ""


def big_head(mode: str, cap: float) -> Result:
    """A chat request with 3,000 extra headers, its head and body in one write: the
    server's status (a 200 is the call served)."""
    body = _chat_body()
    request = many_headers_head(3_000, 20, declared_body=len(body)) + body
    with run_server() as server:
        conn = open_held(server.port, request)
        hold([conn], timeout=10)
        conn.close()
    closed = "closed" if conn.closed is not None else "kept open"
    code = _error_code(conn.body())
    return {
        "value": conn.status(),
        "note": f"{code + '; ' if code else ''}a {(len(request) - len(body)) / 1024:.1f} KiB "
        f"head; {closed}",
    }


def ambiguous_length(mode: str, cap: float) -> Result:
    """A request with both Content-Length and Transfer-Encoding: the status, and
    whether the connection stays open for another request (2 s look)."""
    body = _chat_body()
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: 4\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + chunked
    )
    with run_server() as server:
        conn = open_held(server.port, request)
        hold([conn], timeout=2.0)
        conn.close()
    closed = "closed" if conn.closed is not None else "kept open"
    code = _error_code(conn.body())
    return {"value": conn.status(), "note": f"{code + '; ' if code else ''}{closed}"}


def _flag_known(flag: str) -> bool:
    shown = subprocess.run(
        [sys.executable, "-m", "stormguard_server", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    return flag in shown.stdout


@contextlib.contextmanager
def _priority_server(untrusted: bool) -> Iterator[RunningServer]:
    # 8 admitted at a time (each reserves 224 of the 1,843-token budget), 60 queued;
    # generation slow enough that nothing finishes while the calls arrive.
    args = ["--max-queue-requests", "60", "--max-num-seqs", "8", "--step-base-ms", "20"]
    if untrusted:
        args += ["--trust-priority-from", "10.0.0.0/8"]  # loopback is not in it
    with run_server(*args) as server:
        yield server


def late_priority(mode: str, cap: float) -> Result:
    """120 standard calls, then 60 late ``x-priority: critical`` ones from a caller
    outside ``--trust-priority-from``: standard calls shed, critical ones served.

    Streams, each held open once admitted until every call has arrived and the queue
    has settled (so the queue is full when the late ones come), then let go."""
    untrusted = _flag_known("--trust-priority-from")
    with _priority_server(untrusted) as server:
        outcome = asyncio.run(_priority_waves(server))
    standard, critical = outcome["standard"], outcome["critical"]
    flag = "" if untrusted else "; no --trust-priority-from: every caller believed"
    return {
        "value": f"{standard['shed']}/{critical['served']}",
        "note": f"standard shed of 120 / critical served of 60 (standard evicted after "
        f"queueing {standard['evicted']}, critical shed {critical['shed']}){flag}",
    }


async def _priority_waves(server: RunningServer) -> dict[str, dict[str, int]]:
    body = {
        "model": "stormguard-sim",
        "messages": MESSAGES,
        "max_tokens": 200,
        "ignore_eos": True,
        "stream": True,
    }
    release = asyncio.Event()
    counts = {kind: {"served": 0, "shed": 0, "evicted": 0, "other": 0} for kind in ("s", "c")}
    late_started = asyncio.Event()
    limits = httpx.Limits(max_connections=400, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, timeout=60) as http:

        async def call(kind: str, headers: dict[str, str]) -> None:
            url = server.url("/v1/chat/completions")
            async with http.stream("POST", url, json=body, headers=headers) as response:
                tally = counts[kind]
                if response.status_code == 200:
                    tally["served"] += 1
                    await release.wait()  # hold the engine's place until all have come
                elif response.status_code == 503:
                    tally["shed"] += 1
                    tally["evicted"] += kind == "s" and late_started.is_set()
                else:
                    tally["other"] += 1

        async def settled(total: int) -> None:
            """Until each of ``total`` calls is admitted, shed or in the queue."""
            while True:
                load = await http.get(server.url("/v1/models"))
                queued = int(load.headers.get("x-queue-depth", "0"))
                done = sum(t["served"] + t["shed"] + t["other"] for t in counts.values())
                if done + queued >= total:
                    return
                await asyncio.sleep(0.02)

        tasks = [asyncio.create_task(call("s", {})) for _ in range(120)]
        await settled(120)
        late_started.set()
        critical = {"x-priority": "critical"}
        tasks += [asyncio.create_task(call("c", critical)) for _ in range(60)]
        await settled(180)
        release.set()
        await asyncio.gather(*tasks)
    return {"standard": counts["s"], "critical": counts["c"]}
