"""One attempt, written once for both drivers: a flow that yields the I/O it needs.

``attempt_flow`` makes every decision of an attempt (its endpoint and slot,
its request, what to do with the response, how a failed send or read is
reported, when the response is closed) and yields an action for each piece of
I/O, as httpx's ``Auth.auth_flow`` does. ``call_flow`` (``_call/call_flow.py``)
runs it for each attempt of a call. A driver (``_call/drivers.py``) performs each
action with its own I/O and sends the result back, or throws the I/O's
exception into the flow, which maps it (``run_sync``/``run_async``, here for
any flow). The drivers differ only in how they bound the I/O by the call's
deadline: the async one bounds the send and the body read each by the time left
(``_io/read_within.py``: ``asyncio.timeout`` from their first wait on asyncio,
``anyio.fail_after`` elsewhere; a bare ``TimeoutError`` comes back); the sync one
holds every socket operation to the deadline through the deadline-clipping
transport, whose timeouts come back as httpx timeouts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from .._core.http import http_errors, httpx
from .._io.decoding import send_failure
from .body_reader import BodyReader

if TYPE_CHECKING:
    from .._core.results import Record
    from .._policies.limiter.slot_waiter import SlotWaiter
    from .pipeline import LogicalCall

__all__ = [
    "Action",
    "AttemptFlow",
    "CloseResponse",
    "OpenStream",
    "ReadBody",
    "Send",
    "WaitForSlot",
    "attempt_flow",
    "run_async",
    "run_sync",
]


@dataclass(slots=True)
class WaitForSlot:
    """Wait for the endpoint's concurrency slot (at most ``timeout``); send back the lease."""

    waiter: SlotWaiter
    timeout: float | None


@dataclass(slots=True)
class Send:
    """Send the request (``stream=True``) in the call's ``sending()`` scope; send back
    the response, its body unread."""

    request: httpx.Request


@dataclass(slots=True)
class OpenStream:
    """Wrap the response in the driver's stream class and read up to its first chunk;
    send back the stream."""

    response: httpx.Response
    chunk_type: type[Record]


@dataclass(slots=True)
class ReadBody:
    """Feed the response's decoded body to ``reader``, piece by piece."""

    response: httpx.Response
    reader: BodyReader


@dataclass(slots=True)
class CloseResponse:
    """Close the response; ``failed``: the attempt is failing or cancelled, so close
    it whatever happens (the async driver shields the close from cancellation)."""

    response: httpx.Response
    failed: bool = False


Action: TypeAlias = WaitForSlot | Send | OpenStream | ReadBody | CloseResponse
AttemptFlow: TypeAlias = Generator[Action, Any, Any]
#: The actions of the flow a driver runs (an attempt's, or a whole call's).
A = TypeVar("A")


def attempt_flow(call: LogicalCall, http: httpx.Client | httpx.AsyncClient) -> AttemptFlow:
    """One attempt of ``call``; returns its result (a record, a stream, a response in
    transport or hand-over mode) or raises the attempt's error."""
    waiter = call.reserve()
    while waiter is not None:  # the endpoint is at its concurrency limit: wait for a slot
        waiter = call.granted((yield WaitForSlot(waiter, call.remaining_or_none())))
    request = call.begin_attempt(http)
    try:
        response = yield Send(request)
    except TimeoutError as exc:  # the async driver's bound: the deadline passed
        raise call.deadline_passed("while waiting for the response") from exc
    except http_errors(RuntimeError) as exc:  # RuntimeError: a closed pool, another loop's
        error = send_failure(exc, http)
        if error is None:
            raise
        try:
            raise call.failed(error) from exc
        finally:
            del error  # this frame is in its traceback: a cycle, freed only by the GC
    call.saw_response(response)
    try:
        if call.spec.stream and response.is_success and call.spec.chunk_type is not None:
            return (yield OpenStream(response, call.spec.chunk_type))
        if call.spec.hand_over == "unread" and response.is_success:
            return call.handed_over(response)  # its body is read when asked
        reader = BodyReader(call, response)
        try:
            yield ReadBody(response, reader)
        except TimeoutError as exc:
            raise call.deadline_passed("while reading the response", response_started=True) from exc
        except http_errors(RuntimeError) as exc:
            error = send_failure(exc, http, response_started=True, server_load=call.server_load)
            if error is None:
                raise
            try:
                raise call.failed(error) from exc
            finally:
                del error
    except GeneratorExit:
        raise  # the driver dropped the flow: nothing more may be asked of it
    except BaseException:
        yield CloseResponse(response, failed=True)
        raise
    if not response.is_closed:  # httpx closes a response whose body was read to its end
        yield CloseResponse(response)
    return call.complete(response, reader.body())


def _resume(flow: Generator[A, Any, Any], sent: Any, error: BaseException | None) -> A:
    """The flow's next action, after ``sent`` came back from the last one (or
    ``error`` was raised by it); ``StopIteration`` carries the flow's result."""
    try:
        return flow.send(sent) if error is None else flow.throw(error)
    finally:
        del error  # no cycle through the traceback


def run_sync(
    flow: Generator[A, Any, Any], perform: Callable[[LogicalCall, A], Any], call: LogicalCall
) -> Any:
    """Drive ``flow`` to its result: each action performed by ``perform(call, action)``,
    whose result is sent back and whose exception is thrown in."""
    sent: Any = None
    error: BaseException | None = None
    while True:
        try:
            action = _resume(flow, sent, error)
        except StopIteration as stop:
            return stop.value
        finally:
            sent = error = None
        try:
            sent = perform(call, action)
        except BaseException as exc:
            error = exc


async def run_async(
    flow: Generator[A, Any, Any],
    perform: Callable[[LogicalCall, A], Awaitable[Any]],
    call: LogicalCall,
) -> Any:
    """``run_sync`` with an awaited ``perform``. The call is passed, not bound into
    ``perform`` (a ``functools.partial`` is two more objects alive across each wait)."""
    sent: Any = None
    error: BaseException | None = None
    while True:
        try:
            action = _resume(flow, sent, error)
        except StopIteration as stop:
            return stop.value
        finally:
            sent = error = None
        try:
            sent = await perform(call, action)
        except BaseException as exc:
            error = exc
