"""Context windows as the serving deployment reports them: ``max_model_len`` in ``/v1/models``."""

from __future__ import annotations

from dataclasses import dataclass, field

from .._core.clock import ClockLike, ClockRef
from .._core.fork import fork_safe_lock
from .._core.http import httpx
from ._flow import MAX_LOOKUP_ENDPOINTS, Flow, abandoned, models_url

__all__ = ["ServerContextWindows", "parse_models_response"]


@dataclass
class _Entry:
    expires: float
    context_windows: dict[str, int] = field(default_factory=dict)


class ServerContextWindows:
    """Per-endpoint cache of ``{model id: max_model_len}`` from ``GET {base}/models``,
    for at most ``MAX_LOOKUP_ENDPOINTS`` endpoints (the one written longest ago goes).

    One lookup serves every model of the endpoint for ``ttl`` seconds. A failed or
    unusable answer (none within ``timeout``, which bounds the whole lookup, or a
    body over the driver's size cap) is remembered for ``retry_after`` seconds, so
    an endpoint that is down (or that, like OpenAI's, reports no ``max_model_len``)
    costs one request per period, not one per call.

    A window that refused a call is believed for at most ``retry_after`` seconds
    more (:meth:`refused`): the pre-check applies one endpoint's answer to every
    call of the model, so a wrong one (``max_model_len: 1``, a replica started with
    a shorter window) refuses calls locally for a minute, not for ``ttl``; a right
    one costs a lookup a minute while calls keep being too long.
    """

    def __init__(
        self,
        *,
        ttl: float = 600.0,
        retry_after: float = 60.0,
        timeout: float = 2.0,
        clock: ClockLike | None = None,
    ) -> None:
        self.ttl = ttl
        self.retry_after = retry_after
        self.timeout = timeout
        self._clock = ClockRef(clock)
        self._entries: dict[str, _Entry] = {}
        self._lock = fork_safe_lock()

    def adopt_clock(self, clock: ClockLike) -> None:
        """Read ``clock`` (a client's) unless this was given one of its own."""
        self._clock.adopt(clock)

    def context_window_flow(self, base_url: str | httpx.URL, model: str) -> Flow[int | None]:
        """The context window of ``model`` at ``base_url``, or None if unreported."""
        url = models_url(base_url)
        key = str(url)
        with self._lock:
            entry = self._entries.get(key)
            fresh = entry is not None and entry.expires > self._clock.now()
        if entry is not None and fresh:
            return entry.context_windows.get(model)
        lookup = httpx.Request(
            "GET", url, extensions={"timeout": httpx.Timeout(self.timeout).as_dict()}
        )
        response = yield lookup
        context_windows = parse_models_response(response)
        if context_windows is None and abandoned(lookup):
            return None  # the call ran out of time, not the server: nothing to remember
        now = self._clock.now()
        expires = now + (self.retry_after if context_windows is None else self.ttl)
        with self._lock:
            self._entries.pop(key, None)  # to the end: written last, forgotten last
            self._entries[key] = _Entry(expires, context_windows or {})
            if len(self._entries) > MAX_LOOKUP_ENDPOINTS:
                del self._entries[next(iter(self._entries))]
        return (context_windows or {}).get(model)

    def refused(self, base_url: str | httpx.URL) -> None:
        """A call was refused on the window ``base_url`` reported: look it up again
        after at most ``retry_after`` seconds."""
        key = str(models_url(base_url))
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                entry.expires = min(entry.expires, self._clock.now() + self.retry_after)


def parse_models_response(response: httpx.Response | None) -> dict[str, int] | None:
    """``{id: max_model_len}`` from an OpenAI-style model list; None when unusable.

    A list without any ``max_model_len`` (OpenAI's own) gives an empty dict: the
    endpoint answered, it just reports no context windows.
    """
    if response is None or response.status_code != 200:
        return None
    try:
        data = response.json()
    except ValueError:
        return None
    models = data.get("data") if isinstance(data, dict) else None
    if not isinstance(models, list):
        return None
    context_windows: dict[str, int] = {}
    for model in models:
        if not isinstance(model, dict):
            continue
        model_id, length = model.get("id"), model.get("max_model_len")
        if isinstance(model_id, str) and type(length) is int and length > 0:
            context_windows[model_id] = length
    return context_windows
