"""From a request another client built (openai-python's) to one stormguard call.

The transport (``_transport/transport.py``) knows each API by its path: chat,
completions, embeddings and the Responses API get their spans, pre-check and
stream ends; any other request becomes a plain call all the same.
"""

from __future__ import annotations

import json
from typing import Any

from .._call.call_spec import CallSpec
from .._call.client_core import ClientCore
from .._call.spec_builder import GenerationEndpoint
from .._client.api_specs import EMBEDDINGS, RESPONSES
from .._core.http import httpx
from .._core.results import ModelList
from .._policies.routing.deployment import pin_from_headers

__all__ = ["spec_from_request"]

# Headers of the incoming request that describe its bytes or its connection, not
# the call: httpx sets them again for each attempt, and the encodings are the
# ones the pipeline decodes (in bounded steps) before it hands the body on.
_HOP_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "accept-encoding"}
)


def spec_from_request(core: ClientCore, request: httpx.Request) -> CallSpec:
    """One logical call for a request built by another client (openai-python)."""
    content = request.read()
    body: dict[str, Any] | None = None
    if content and "json" in request.headers.get("content-type", "json"):
        try:
            parsed = json.loads(content)
        except ValueError:
            parsed = None
        body = parsed if isinstance(parsed, dict) else None
    url = request.url
    # A request under the client's base path, to one of its endpoints, may go to any
    # endpoint (path relative to the base); anything else is sent where it points.
    base_path = httpx.URL(core.base_url).path.rstrip("/")
    relative: str | None = None
    # The path as sent: a %2F in it (a model id with a slash) is not a separator.
    raw_path = url.raw_path.decode("ascii").split("?", 1)[0]
    if url.netloc.decode("ascii") in core.netlocs() and raw_path.startswith(base_path + "/"):
        relative = raw_path[len(base_path) + 1 :]
        if url.query:
            relative += "?" + url.query.decode("ascii", "replace")
    endpoint = _endpoint_for(request.method, url.path)
    timeout = core.timeout
    requested = (request.extensions.get("timeout") or {}).get("read")
    if isinstance(requested, (int, float)) and requested > 0:
        timeout = requested if timeout is None else min(timeout, requested)
    model = body.get("model") if body is not None else None
    headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
    # A pin in openai-python's extra_headers (x-stormguard-tier, -deployment): never sent.
    pin, headers = pin_from_headers(headers)
    if pin is not None:
        core.check_pin(pin)
    keys = core.affinity_keys
    return CallSpec(
        method=request.method,
        path=relative if relative is not None else url.path,
        result_type=endpoint.result_type if endpoint is not None else ModelList,
        operation=endpoint.operation if endpoint is not None else "http",
        body=body,
        stream=bool(body and body.get("stream")),
        chunk_type=endpoint.chunk_type if endpoint is not None else None,
        model=model if isinstance(model, str) else None,
        timeout=timeout,
        headers=headers,
        raw=True,
        absolute_url=None if relative is not None else str(url),
        content=content or None,
        pin=pin,
        affinity_key=None if keys is None else keys.key_of(body),
        # A request sent where it points has no other endpoint to hedge to.
        hedge=core.hedge_calls if relative is not None else None,
    )


def _endpoint_for(method: str, path: str) -> GenerationEndpoint | None:
    """The API a request of openai-python's calls: its span operation, its result,
    and how its stream ends (chat's ``[DONE]``, the Responses API's last event)."""
    if method != "POST":
        return None
    if path.endswith("/chat/completions"):
        return GenerationEndpoint.CHAT
    if path.endswith("/completions"):
        return GenerationEndpoint.COMPLETION
    if path.endswith("/responses"):
        return RESPONSES
    if path.endswith("/embeddings"):
        return EMBEDDINGS
    return None
