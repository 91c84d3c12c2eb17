"""The I/O of a call, sync and async: the only code the two clients do not share.

``call_flow`` (``_call/call_flow.py``) decides every step of a call and yields the
I/O it needs; a driver performs it. The two drivers differ in how that I/O is
bounded by the call's deadline:

- sync: every socket operation of the call ends by the deadline, as the
  deadline-clipping transport reads it (``call.deadline.bound()``); the
  connection keeps it for a stream's later reads; timeouts come back as
  httpx timeouts. A transport of another kind keeps httpx's per-operation
  timeouts.
- async: the send and the body read are each bounded by the time left
  (``_io/read_within.py``: ``asyncio.timeout`` from their first wait on asyncio,
  ``anyio.fail_after`` elsewhere; a bare ``TimeoutError`` comes back), and a failed
  attempt's response is closed shielded from cancellation.

A hedged call (``_call/hedge_race.py``) runs its two racers as tasks of one task
group (async) or as two threads (sync), and each driver cancels the loser its own
way: its task cancelled, or its sockets shut down.

Everything else in ``Client`` and ``AsyncClient`` is one text
(``_client/client.py`` is generated from ``_client/async_client.py``: scripts/unasync.py).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Awaitable, Coroutine
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, cast

import anyio
from anyio.lowlevel import checkpoint

from .._core.exceptions import ClientClosedError
from .._core.http import httpx
from .._core.verdict import AttemptAbandoned
from .._io.body import aiter_body, iter_body
from .._io.deadline_transport import DeadlineTransport, hold_to_deadlines
from .._io.own_pool import OwnAsyncClient, OwnClient, own_pool
from .._io.pool_life import given_pool, used_given_pool, wake_reads
from .._io.read_within import await_bounded, await_within
from .._policies.quota import SharedAsk
from ..openai_errors import as_openai_error
from ..tokens._flow import drive_precheck_async, drive_precheck_sync
from .attempt_flow import (
    CloseResponse,
    OpenStream,
    ReadBody,
    Send,
    WaitForSlot,
    run_async,
    run_sync,
)
from .call_flow import (
    AwaitDiscovery,
    CallAction,
    CallFlow,
    CheckTokens,
    Sleep,
    call_flow,
    hedge_flow,
)
from .call_result import Delivery
from .hedge_race import Race, Racer
from .pipeline import LogicalCall
from .stream_state import StreamState
from .streaming import AsyncStream, Stream

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from .._core.http import AsyncHTTPClient, SyncHTTPClient
    from .._policies.hedge.policy import HedgePolicy
    from .call_spec import CallSpec
    from .client_core import ClientCore

__all__ = [
    "BACKEND_VARIABLE",
    "HTTPBackend",
    "closed_error",
    "http_backend",
    "http_pool_async",
    "http_pool_sync",
    "run_call_async",
    "run_call_sync",
]


def http_pool_sync(given: SyncHTTPClient | None, limits: httpx.Limits) -> httpx.Client:
    """The client's pool: ``given`` (its ``HTTPTransport`` s then held to the calls'
    deadlines), else an ``httpx.Client`` of its own (``own_pool.OwnClient``) with its
    environment proxies, on ``DeadlineTransport`` s holding ``limits`` among them
    (``own_pool``)."""
    if given is None:
        return own_pool(OwnClient, DeadlineTransport, limits)
    hold_to_deadlines(given)
    given_pool(given)
    # httpx2's Client has httpx's API: the pipeline drives either one the same way.
    return cast("httpx.Client", given)


#: The HTTP library under the async client's own pool: httpx's (httpcore's) or aiohttp's.
HTTPBackend: TypeAlias = Literal["httpx", "aiohttp"]
#: The backend of an ``AsyncClient`` not given ``http_backend`` (unset: httpx).
BACKEND_VARIABLE = "STORMGUARD_HTTP_BACKEND"
_BACKENDS = ("httpx", "aiohttp")


def http_backend(asked: str | None, given: object) -> HTTPBackend:
    """The backend of an async client asked for ``asked`` (None: the environment's,
    else httpx), with ``given`` as its ``http_client``; a clear error for a name of
    none, or for both a backend and an ``http_client``."""
    if asked is not None and given is not None:
        raise TypeError(
            "http_backend chooses the library of the client's own pool: with your own"
            " http_client, pass one or the other"
        )
    if asked is None:
        asked = os.environ.get(BACKEND_VARIABLE) or "httpx"
        if given is not None:
            return "httpx"  # your pool is used as it is
        if asked not in _BACKENDS:
            raise ValueError(f"{BACKEND_VARIABLE} must be httpx or aiohttp, got {asked[:50]!r}")
    if asked not in _BACKENDS:
        raise ValueError(f"http_backend must be 'httpx' or 'aiohttp', got {asked!r:.50}")
    return cast("HTTPBackend", asked)


def http_pool_async(
    given: AsyncHTTPClient | None, limits: httpx.Limits, backend: str | None = None
) -> httpx.AsyncClient:
    """The async client's pool: ``given``, else an ``httpx.AsyncClient`` of its own
    (``own_pool.OwnAsyncClient``) with its environment proxies, holding ``limits``
    among its transports (``own_pool``): httpx's, or with ``backend`` "aiohttp"
    (``http_backend``) aiohttp's (``_io/aiohttp_transport.py``)."""
    chosen = http_backend(backend, given)
    if given is not None:
        given_pool(given)
        return cast("httpx.AsyncClient", given)
    if chosen == "aiohttp":
        try:
            from .._io.aiohttp_transport import aiohttp_pool
        except ModuleNotFoundError as exc:
            if exc.name not in ("aiohttp", "multidict", "yarl"):
                raise
            raise ImportError(
                "http_backend='aiohttp' needs aiohttp: pip install 'stormguard[aiohttp]'"
            ) from exc
        return own_pool(OwnAsyncClient, aiohttp_pool, limits, shard=False)
    return own_pool(OwnAsyncClient, httpx.AsyncHTTPTransport, limits)


def closed_error(core: ClientCore) -> ClientClosedError:
    """The error a call of a closed client fails with at once (openai's class too,
    with ``openai_errors=True``)."""
    error = ClientClosedError()
    return as_openai_error(error) if core.openai_errors else error


def run_call_sync(core: ClientCore, http: httpx.Client, spec: CallSpec) -> Any:
    """One logical call, its I/O done with ``http``."""
    if type(http) is not OwnClient:
        used_given_pool(http)
    if spec.hedge is not None:
        return _hedged_sync(core, http, spec, spec.hedge)
    call = LogicalCall(core, spec, http)
    with call.deadline.bound():  # read by the deadline-clipping transport
        return run_sync(call_flow(call, http), _perform_sync, call)


def run_call_async(
    core: ClientCore, http: httpx.AsyncClient, spec: CallSpec
) -> Coroutine[Any, Any, Any]:
    """The async twin of :func:`run_call_sync`: the coroutine to await. Not a coroutine
    of its own: each layer of the call's await chain is an object the collector keeps
    walking while the call waits (docs/benchmarks.md, "The aiohttp backend")."""
    if type(http) is not OwnAsyncClient:
        used_given_pool(http)
    if spec.hedge is not None:
        return _hedged_async(core, http, spec, spec.hedge)
    call = LogicalCall(core, spec, http)
    return run_async(call_flow(call, http), _perform_async, call)


async def _hedged_async(
    core: ClientCore, http: httpx.AsyncClient, spec: CallSpec, policy: HedgePolicy
) -> Any:
    """A hedged call (``_call/hedge_race.py``): the primary in a task; at the delay
    (or a later one, when the budget or the endpoints held it back), the hedge in
    another; the first answer is the call's, the other task cancelled (its response
    closed shielded from the cancellation: the server sees the connection close and
    aborts the request)."""
    race = Race(core, spec, http, policy)
    primary = race.primary.call
    if race.delay is None:  # too few latencies known: a plain call, timed
        result = await run_async(call_flow(primary, http), _perform_async, primary)
        race.observe_unhedged()
        return result
    over = anyio.Event()
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(_racer_async, race, race.primary, call_flow(primary, http), over)
            group.start_soon(_hedge_when_due, core, race, http, group, over)
            await over.wait()
            group.cancel_scope.cancel()  # the loser, and the delay's sleep
    except BaseException:
        race.abandoned()
        raise
    del group  # an error raised below would hold it, and it its host task: a cycle
    left_open = race.loser_result()
    if left_open is not None:  # both answered at once: the loser's stream or response
        with anyio.CancelScope(shield=True):
            await _aclose_result(left_open)
    return race.finish()


async def _racer_async(race: Race, racer: Racer, flow: CallFlow, over: anyio.Event) -> None:
    try:
        result = await run_async(flow, _perform_async, racer.call)
    except anyio.get_cancelled_exc_class():
        if race.over():
            return  # it lost the race: this task group cancelled it, and nothing waits on it
        raise
    except Exception as exc:
        race.ended(racer, error=exc)
        del exc
    else:
        race.ended(racer, result)
    if race.over():
        over.set()


async def _hedge_when_due(
    core: ClientCore,
    race: Race,
    http: httpx.AsyncClient,
    group: TaskGroup,
    over: anyio.Event,
) -> None:
    """At the delay, and after each wait ``next_ask`` gives until one goes or none
    may: the hedge, in its own task."""
    try:
        while True:
            await core.clock.asleep(race.next_ask())
            await checkpoint()  # a test's clock may not yield: the racers run
            hedge = race.send_hedge()
            if hedge is not None:
                assert race.hedge is not None
                group.start_soon(_racer_async, race, race.hedge, hedge_flow(hedge, http), over)
                return
            if not race.may_hedge_later():
                return
    except anyio.get_cancelled_exc_class():
        if race.over():
            return  # the race is decided: nothing waits on this task (nor holds its frame)
        raise


async def _aclose_result(result: Any) -> None:
    close = getattr(result, "aclose", None)
    if close is None and isinstance(result, Delivery):
        close = result.response.aclose
    if close is not None:
        await close()


def _hedged_sync(core: ClientCore, http: httpx.Client, spec: CallSpec, policy: HedgePolicy) -> Any:
    """A hedged call in the sync client (``_call/hedge_race.py``): the primary in a
    thread; at the delay (on the real clock), the hedge in another; the caller's
    thread takes the first answer. The loser is abandoned: the sockets its deadline
    bounds are shut down, so its blocked read ends and the server sees the
    connection close, and it stops at its next step (``AttemptAbandoned``, a
    cancellation). A winning stream is read from the caller's thread: its
    connection keeps its deadline."""
    race = Race(core, spec, http, policy)
    primary = race.primary.call
    if race.delay is None:  # too few latencies known: a plain call, timed
        with primary.deadline.bound():
            result = run_sync(call_flow(primary, http), _perform_sync, primary)
        race.observe_unhedged()
        return result
    changed = threading.Event()
    threads = [_racer_thread(race, race.primary, call_flow(primary, http), changed)]
    try:
        changed.wait(race.next_ask())
        hedge = race.send_hedge()
        while hedge is None and race.may_hedge_later():
            changed.clear()  # a racer that ends sets it: the race is over
            if race.over():
                break
            changed.wait(race.next_ask())
            hedge = race.send_hedge()
        if hedge is not None:
            assert race.hedge is not None
            threads.append(_racer_thread(race, race.hedge, hedge_flow(hedge, http), changed))
        while True:
            changed.clear()
            if race.over():
                break
            changed.wait()
    finally:
        left = not race.over()  # the caller left (KeyboardInterrupt): both racers go
        for racer in race.abandon_running():
            racer.call.deadline.hold_to(core.clock.now(), "the call's race was over")
            wake_reads(http, racer.call.deadline)
        if left:
            race.abandoned()
    for thread in threads:
        thread.join(_LOSER_GRACE_S)  # a loser in a backoff or a queue ends on its own
    left_open = race.loser_result()
    if left_open is not None:  # both answered at once: the loser's stream or response
        close = getattr(left_open, "close", None)
        if close is None and isinstance(left_open, Delivery):
            close = left_open.response.close
        if close is not None:
            close()
    return race.finish()


#: How long the caller's thread waits for a hedged call's loser to stop (its read
#: woken at once; a backoff sleep or a queue wait ends on its own after this).
_LOSER_GRACE_S = 1.0


def _racer_thread(race: Race, racer: Racer, flow: CallFlow, changed: threading.Event) -> Any:
    thread = threading.Thread(
        target=_racer_sync,
        args=(race, racer, flow, changed),
        name=f"stormguard-hedge-{'hedge' if racer.call.hedge else 'primary'}",
        daemon=True,
    )
    thread.start()
    return thread


def _racer_sync(race: Race, racer: Racer, flow: CallFlow, changed: threading.Event) -> None:
    call = racer.call

    def perform(call: LogicalCall, action: CallAction) -> Any:
        if racer.abandoned and not isinstance(action, CloseResponse):
            raise AttemptAbandoned
        try:
            return _perform_sync(call, action)
        except BaseException:
            if racer.abandoned:  # its socket shut down under it: not the server's doing
                raise AttemptAbandoned from None
            raise

    try:
        with call.deadline.bound():
            result = run_sync(flow, perform, call)
    except AttemptAbandoned:
        return  # it lost the race: nothing waits on it
    except Exception as exc:
        race.ended(racer, error=exc)
        del exc
    else:
        race.ended(racer, result)
    finally:
        changed.set()


def _perform_sync(call: LogicalCall, action: CallAction) -> Any:
    core, http = call.core, cast("httpx.Client", call.http)
    if isinstance(action, Send):
        with call.sending():
            return http.send(action.request, stream=True)
    if isinstance(action, ReadBody):
        for piece in iter_body(action.response):
            action.reader.feed(piece)
        return None
    if isinstance(action, CloseResponse):
        action.response.close()
        return None
    if isinstance(action, OpenStream):
        stream: Stream[Any] = Stream(StreamState(call, action.response, action.chunk_type))
        stream._prefetch()
        return stream
    if isinstance(action, WaitForSlot):
        return action.waiter.wait(action.timeout)
    if isinstance(action, Sleep):
        core.clock.sleep(action.seconds)
        return None
    if isinstance(action, SharedAsk):
        return action.ask_sync()  # redis-py's socket timeouts bound it
    if isinstance(action, CheckTokens):
        return drive_precheck_sync(action.flow, http, call.deadline, core.max_response_bytes)
    assert isinstance(action, AwaitDiscovery) and core.discovery is not None
    core.discovery.ready(action.deadline)
    return None


def _perform_async(call: LogicalCall, action: CallAction) -> Awaitable[Any]:
    """The awaitable of ``action``'s I/O, for ``run_async`` to await in its place: no
    coroutine of its own stays alive across the wait."""
    core, http = call.core, cast("httpx.AsyncClient", call.http)
    if isinstance(action, Send):
        # The deadline bounds the whole send, not only each socket operation.
        send = await_bounded(http.send(action.request, stream=True), call.remaining_or_none())
        return send if call._trace is None else _sending(call, send)
    if isinstance(action, ReadBody):
        return await_within(_read_body(action), call.remaining_or_none())
    if isinstance(action, CloseResponse):
        return _close(action)
    if isinstance(action, OpenStream):
        return _open_stream(call, action)
    if isinstance(action, WaitForSlot):
        return action.waiter.wait_async(action.timeout)
    if isinstance(action, Sleep):
        return core.clock.asleep(action.seconds)
    if isinstance(action, SharedAsk):
        return action.ask_async()  # redis.asyncio, within the store's timeout
    if isinstance(action, CheckTokens):
        return drive_precheck_async(action.flow, http, call.deadline, core.max_response_bytes)
    assert isinstance(action, AwaitDiscovery) and core.discovery is not None
    return core.discovery.ready_async(action.deadline)


async def _sending(call: LogicalCall, send: Awaitable[Any]) -> Any:
    """``send`` awaited in the call's ``sending()`` scope (telemetry on)."""
    with call.sending():
        return await send


async def _close(action: CloseResponse) -> None:
    if action.failed:
        with anyio.CancelScope(shield=True):
            await action.response.aclose()
    else:
        await action.response.aclose()


async def _open_stream(call: LogicalCall, action: OpenStream) -> AsyncStream[Any]:
    stream: AsyncStream[Any] = AsyncStream(StreamState(call, action.response, action.chunk_type))
    await stream._prefetch()
    return stream


async def _read_body(action: ReadBody) -> None:
    async for piece in aiter_body(action.response):
        action.reader.feed(piece)
