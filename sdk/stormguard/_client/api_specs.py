"""What ``embeddings.create``, ``responses.create`` and ``models.retrieve`` send.

The call specs of the endpoints beyond chat and completions, built on the same
helpers as theirs (``SpecBuilder``'s, which ``ClientCore`` is: model, body,
timeout, headers, query), so every one runs the whole pipeline. One function each,
used by ``Client`` and ``AsyncClient`` alike, and the endpoint descriptions that
transport mode (``_transport/spec.py``) matches openai-python's requests against.

Span operation names are OpenTelemetry's GenAI values: ``embeddings``, and
``chat`` for the Responses API (a model generating from a conversation, as
the semantic conventions name OpenAI's chat API; ``generate_content`` is
Gemini's). ``models.retrieve`` is ``models``, as ``models.list``.
"""

from __future__ import annotations

import array
import base64
import binascii
import sys
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

from .._call.arguments import CallExtras
from .._call.call_spec import CallSpec
from .._call.client_core import ClientCore
from .._call.openai_conventions import NOT_GIVEN, Unset, drop_omitted, is_omitted
from .._call.spec_builder import GenerationEndpoint
from .._call.stream_timeouts import StreamTimeouts
from .._core.exceptions import APIResponseValidationError
from .._core.results import (
    CallInfo,
    CreateEmbeddingResponse,
    Model,
    Record,
    Response,
    ResponseStreamEvent,
)
from .._policies.routing.deployment import Pin

__all__ = [
    "EMBEDDINGS",
    "RESPONSES",
    "embeddings_spec",
    "model_spec",
    "responses_spec",
]

#: ``POST /responses``: a ``Response``, or a stream of ``ResponseStreamEvent``.
RESPONSES = GenerationEndpoint("responses", "chat", Response, ResponseStreamEvent)
#: ``POST /embeddings`` (never streamed: the chunk type is unused).
EMBEDDINGS = GenerationEndpoint("embeddings", "embeddings", CreateEmbeddingResponse, Record)

# openai-python quotes a path parameter as RFC 3986's ``pchar``: a slash in a model
# id ("org/model", as vLLM serves them) is %2F, not a path separator.
_PCHAR_SAFE = "!$&'()*+,;=:@"


def model_spec(core: ClientCore, model: str, extras: CallExtras) -> CallSpec:
    """``GET /models/{model}``; an empty id is openai's ``ValueError``."""
    if not isinstance(model, str) or not model:
        raise ValueError(f"Expected a non-empty value for `model` but received {model!r}")
    return core._spec(
        extras,
        method="GET",
        path=f"models/{quote(model, safe=_PCHAR_SAFE)}",
        result_type=Model,
        operation="models",
    )


def embeddings_spec(
    core: ClientCore,
    *,
    input: object,
    model: str | None,
    encoding_format: object,
    extras: CallExtras,
    params: Mapping[str, Any],
    pin: Pin | None = None,
) -> CallSpec:
    """``POST /embeddings``. Without an ``encoding_format`` the vectors are asked
    for in base64 and decoded to floats, as openai-python does (a quarter of the
    bytes of JSON floats); one given is sent and its answer left as it comes."""
    chosen = core._model_for(model)
    decode = is_omitted(encoding_format) or encoding_format is None
    body: dict[str, Any] = {"model": chosen, "input": _json_input(input)}
    body.update(drop_omitted(params))
    body["encoding_format"] = "base64" if decode else encoding_format
    if extras.extra_body:
        body.update(drop_omitted(extras.extra_body))
    return core._spec(
        extras,
        method="POST",
        path=EMBEDDINGS.path,
        result_type=Base64Embeddings if decode else CreateEmbeddingResponse,
        operation=EMBEDDINGS.operation,
        body=body,
        model=chosen,
        pin=pin,
    )


def responses_spec(
    core: ClientCore,
    *,
    input: object,
    model: str | None,
    stream: object,
    extras: CallExtras,
    params: Mapping[str, Any],
    pin: Pin | None = None,
    stream_timeouts: StreamTimeouts | Unset | None = NOT_GIVEN,
) -> CallSpec:
    """``POST /responses``, JSON or SSE; ``instructions``, ``max_output_tokens`` and
    every other field go into the body as given (omitted ones left out)."""
    streaming = bool(stream) and not is_omitted(stream)
    return core._generation_spec(
        RESPONSES, "input", _json_input(input), model, streaming, extras, params, pin,
        stream_timeouts,
    )  # fmt: skip


def _json_input(value: object) -> object:
    """``input`` as JSON sends it: a text as it is, any other iterable (a tuple, a
    generator of token ids) as a list, each item likewise; omitted values left out."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        return drop_omitted(value)
    return [_json_input(item) for item in value]


class Base64Embeddings(CreateEmbeddingResponse):
    """A ``CreateEmbeddingResponse`` asked for in base64 on the caller's behalf: each
    vector is decoded to floats (little-endian float32, as OpenAI and vLLM send
    them) when the result is built, so a vector that is not valid base64 float32
    is a validation error of the attempt, not a surprise at first use."""

    __slots__ = ()

    def __init__(self, data: Mapping[str, Any], info: CallInfo | None = None) -> None:
        items = data.get("data")
        if isinstance(items, list):
            for index, item in enumerate(items):
                if isinstance(item, dict) and isinstance(item.get("embedding"), str):
                    item["embedding"] = _floats(item["embedding"], index, info)
        super().__init__(data, info)

    def __repr__(self) -> str:
        return f"CreateEmbeddingResponse({dict(self._data)!r})"


def _floats(text: str, index: int, info: CallInfo | None) -> list[float]:
    try:
        raw = base64.b64decode(text, validate=True)
        if len(raw) % 4:
            raise ValueError(f"{len(raw)} bytes is not a whole number of float32")
    except (binascii.Error, ValueError) as exc:
        raise APIResponseValidationError(
            f"Embedding {index} is not base64 float32 ({exc})",
            status_code=200,
            server_load=None if info is None else info.server_load,
            request_id=None if info is None else info.request_id,
        ) from None
    vector = array.array("f", raw)
    if sys.byteorder == "big":
        vector.byteswap()
    return vector.tolist()
