"""``POST /v1/embeddings``: openai's embeddings under the same admission as chat.

The engine's work for an embeddings request is the prefill of its inputs and
nothing else: admitted at their token count (no output tokens), run as one
prefill of all of them (the same tokens, KV blocks and step time as a batch of
them, within one block's rounding) that ends, and frees its KV blocks, in the
step that completes it. Each input's vector is then derived from its text (or
token ids) alone: the same input always gets the same unit vector, and a
``dimensions`` below the model's is a prefix of it, renormalised, as openai's
``text-embedding-3`` models shorten theirs.
"""

from __future__ import annotations

import array
import base64
import hashlib
import json
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from fastapi.responses import Response
from starlette.types import Receive

from stormguard_server.api.answer import Output
from stormguard_server.api.generation import prefill_call, serve_generation, too_long_response
from stormguard_server.api.schemas import EmbeddingRequest
from stormguard_server.http.errors import error_response
from stormguard_server.state import ServerState

# openai's limit on the inputs of one request.
MAX_INPUTS = 2048
# A token id is a 32-bit number in every tokenizer an OpenAI-compatible server has.
MAX_TOKEN_ID = 2**31 - 1

_SEED_DOMAIN = b"stormguard-embedding\x00"


@dataclass(frozen=True, slots=True)
class EmbeddingInput:
    """One input: the bytes its vector is derived from, and its token count."""

    key: bytes
    tokens: int


def inputs_of(state: ServerState, body: EmbeddingRequest) -> list[EmbeddingInput] | Response:
    """The request's inputs, counted as the chat route counts prompts; a 400 for an empty
    input, too many inputs, a token id out of range, or an input over the context."""
    raw = body.input
    items: list[str | list[int]]
    single = isinstance(raw, str) or (bool(raw) and all(isinstance(x, int) for x in raw))
    if isinstance(raw, str):
        items = [raw]
    elif single:
        items = [[x for x in raw if isinstance(x, int)]]
    else:
        items = [x for x in raw if isinstance(x, str | list)]
    if not items:
        return _invalid("'input' must not be empty")
    if len(items) > MAX_INPUTS:
        return _invalid(f"'input' has {len(items)} items; at most {MAX_INPUTS} are allowed")
    inputs: list[EmbeddingInput] = []
    for index, item in enumerate(items):
        where = "input" if single else f"input[{index}]"
        if not item:
            return _invalid(f"'{where}' must not be empty")
        if isinstance(item, str):
            inputs.append(EmbeddingInput(_text_key(item), len(state.engine.encode(item))))
            continue
        if any(not 0 <= token <= MAX_TOKEN_ID for token in item):
            return _invalid(f"'{where}' holds a token id outside 0..{MAX_TOKEN_ID}")
        inputs.append(EmbeddingInput(b"i" + array.array("q", item).tobytes(), len(item)))
    limit = state.engine.max_model_len
    for index, one in enumerate(inputs):
        if one.tokens > limit:
            return too_long_response(
                state,
                f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {one.tokens} tokens in input {index} for embedding generation. "
                "Please reduce the length of the input.",
                param="input",
            )
    return inputs


async def serve_embeddings(
    state: ServerState,
    body: EmbeddingRequest,
    *,
    model: str,
    headers: Mapping[str, str],
    receive: Receive,
) -> Response:
    """Check, admit, prefill and answer one embeddings request."""
    full = state.config.embedding_dimensions
    dimensions = body.dimensions or full
    if dimensions > full:
        return _invalid(
            f"'dimensions' is {dimensions}; this model's embeddings have {full}",
            param="dimensions",
        )
    inputs = inputs_of(state, body)
    if isinstance(inputs, Response):
        return inputs
    answer = EmbeddingsAnswer(
        keys=tuple(one.key for one in inputs),
        dimensions=dimensions,
        encoding_format=body.encoding_format,
    )
    call = prefill_call(
        kind="embedding",
        model=model,
        prompt="\n".join(one.key.hex()[:64] for one in inputs),  # seeds the engine only
        prompt_tokens=sum(one.tokens for one in inputs),
        answer=answer,
        headers=headers,
    )
    return await serve_generation(state, call, receive)


@dataclass(frozen=True, slots=True)
class EmbeddingsAnswer:
    """openai's ``CreateEmbeddingResponse``: one vector per input, in input order."""

    keys: tuple[bytes, ...]
    dimensions: int
    encoding_format: Literal["float", "base64"]

    def body(self, out: Output) -> dict[str, Any]:
        return {**self._envelope(out), "data": [self._item(i) for i in range(len(self.keys))]}

    def render(self, out: Output) -> bytes:
        """The body as JSON, one vector at a time (2048 vectors of 1536 dimensions: about
        1.3 s as base64, 5 s as float, spent in a worker thread)."""
        head = json.dumps(self._envelope(out), separators=(",", ":"))[:-1]
        items = ",".join(
            json.dumps(self._item(i), separators=(",", ":")) for i in range(len(self.keys))
        )
        return f'{head},"data":[{items}]}}'.encode()

    def _envelope(self, out: Output) -> dict[str, Any]:
        return {
            "object": "list",
            "model": out.model,
            "usage": {"prompt_tokens": out.prompt_tokens, "total_tokens": out.prompt_tokens},
        }

    def _item(self, index: int) -> dict[str, Any]:
        vector = embedding_vector(self.keys[index], self.dimensions)
        encoded: list[float] | str
        if self.encoding_format == "base64":
            if sys.byteorder != "little":  # openai decodes little-endian float32
                vector.byteswap()
            encoded = base64.b64encode(vector.tobytes()).decode("ascii")
        else:
            encoded = vector.tolist()
        return {"object": "embedding", "index": index, "embedding": encoded}


def embedding_vector(key: bytes, dimensions: int) -> array.array[float]:
    """The unit float32 vector of an input: SHAKE-256 of its key read as signed 32-bit
    numbers, scaled to length 1. A shorter vector is a prefix of a longer one before
    scaling (SHAKE's output is), so ``dimensions`` shortens without changing direction
    more than dropping components does. About half a microsecond a dimension (the scaling, one
    float multiplication per component, is most of it)."""
    raw = array.array("i", hashlib.shake_256(_SEED_DOMAIN + key).digest(4 * dimensions))
    norm = math.hypot(*raw) or 1.0
    return array.array("f", map((1.0 / norm).__mul__, raw))


def _text_key(text: str) -> bytes:
    return b"t" + text.encode("utf-8", "surrogatepass")


def _invalid(message: str, *, param: str = "input") -> Response:
    return error_response(400, message, code="invalid_request", param=param)
