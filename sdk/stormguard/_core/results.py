"""OpenAI-shaped results with attribute access, built on the decoded JSON.

Hand-written rather than pydantic models on purpose: results must keep every
unknown field a server adds (vLLM, TGI and OpenAI all do), must cost next to
nothing per call (the SDK's overhead target is 10% of a raw httpx call), and the
SDK's runtime dependencies stay small. Access is lazy: nothing is converted
until it is read, and what was converted is cached.
"""

from __future__ import annotations

import copy
import inspect
import json
from collections.abc import Collection, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from ..protocol import ServerLoad
    from .history import AttemptRecord, FallbackStep
    from .precheck import Precheck
    from .rate_limit_headers import RateLimit
    from .stop_reason import StopReason

__all__ = [
    "CALL_INFO_EXTENSION",
    "CallInfo",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionMessage",
    "Choice",
    "ChoiceDelta",
    "ChunkChoice",
    "Completion",
    "CompletionChoice",
    "CompletionUsage",
    "CreateEmbeddingResponse",
    "Embedding",
    "EmbeddingUsage",
    "Model",
    "ModelList",
    "Record",
    "Response",
    "ResponseStreamEvent",
    "ResponseUsage",
    "output_text_of",
]

_MISSING = object()


class Record:
    """A JSON object with attribute access.

    Declared fields (class annotations) read as None when the server left them
    out; undeclared ones read as attributes too when present. ``obj["field"]``
    works as well, and ``to_dict()`` returns a deep copy of the JSON.
    """

    __slots__ = ("_cache", "_data")

    #: Fields whose values are records of a given type (or lists of them).
    _nested: ClassVar[Mapping[str, type[Record]]] = {}
    #: Declared fields that read as None when absent.
    _optional: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = data
        self._cache: dict[str, Any] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declared: set[str] = set()
        for klass in cls.__mro__:
            declared.update(inspect.get_annotations(klass))
        cls._optional = frozenset(name for name in declared if not name.startswith("_"))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        cache = self._cache
        value = cache.get(name, _MISSING)
        if value is not _MISSING:
            return value
        raw = self._data.get(name, _MISSING)
        if raw is _MISSING:
            if name in self._optional:
                return None
            raise AttributeError(f"{type(self).__name__!s} has no field {name!r}")
        value = _wrap(raw, self._nested.get(name, Record))
        cache[name] = value
        return value

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def get(self, key: str, default: Any = None) -> Any:
        """The raw JSON value of ``key``, as ``dict.get``."""
        return self._data.get(key, default)

    def to_dict(self) -> dict[str, Any]:
        """A deep copy of the JSON object, unknown fields included."""
        return copy.deepcopy(dict(self._data))

    def to_json(self, *, indent: int | None = 2) -> str:
        """The JSON object as text, unknown fields included (openai's ``to_json``)."""
        return json.dumps(dict(self._data), indent=indent)

    def model_dump(
        self,
        *,
        mode: str = "python",
        include: Collection[str] | None = None,
        exclude: Collection[str] | None = None,
        by_alias: bool | None = None,
        exclude_unset: bool = False,
        exclude_defaults: bool = False,
        exclude_none: bool = False,
        round_trip: bool = False,
        warnings: bool | str = True,
    ) -> dict[str, Any]:
        """pydantic's ``model_dump()``, as openai's models have it, for code written
        against them: a copy of the JSON, unknown fields included, in which every
        field the record declares is present (None when the server left it out),
        nested records alike. ``exclude_unset`` leaves those out (the JSON as it
        came, as ``to_dict()``), ``exclude_none`` and ``exclude_defaults`` leave out
        every None; ``include`` and ``exclude`` name top-level fields. ``mode``,
        ``by_alias``, ``round_trip`` and ``warnings`` change nothing: the values are
        JSON already and the names are the API's."""
        dumped = _dumped(
            type(self), self._data, not exclude_unset, exclude_none or exclude_defaults
        )
        if include is not None:
            dumped = {k: v for k, v in dumped.items() if k in include}
        if exclude is not None:
            dumped = {k: v for k, v in dumped.items() if k not in exclude}
        return dumped

    def model_dump_json(
        self,
        *,
        indent: int | None = None,
        include: Collection[str] | None = None,
        exclude: Collection[str] | None = None,
        by_alias: bool | None = None,
        exclude_unset: bool = False,
        exclude_defaults: bool = False,
        exclude_none: bool = False,
        round_trip: bool = False,
        warnings: bool | str = True,
    ) -> str:
        """pydantic's ``model_dump_json()``: :meth:`model_dump` as JSON text, compact
        unless ``indent`` is given."""
        dumped = self.model_dump(
            include=include,
            exclude=exclude,
            exclude_unset=exclude_unset,
            exclude_defaults=exclude_defaults,
            exclude_none=exclude_none,
        )
        if indent is None:
            return json.dumps(dumped, separators=(",", ":"))
        return json.dumps(dumped, indent=indent)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Record):
            return NotImplemented
        return type(self) is type(other) and self._data == other._data

    __hash__ = None  # type: ignore[assignment]  # mutable JSON underneath

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self._data)!r})"


def _dumped(
    record_type: type[Record], data: Mapping[str, Any], fill: bool, drop_none: bool
) -> dict[str, Any]:
    """``model_dump`` of one JSON object read as ``record_type``: declared fields the
    object lacks added as None (``fill``), None values left out (``drop_none``)."""
    out: dict[str, Any] = {}
    for name, value in data.items():
        value = _dumped_value(value, record_type._nested.get(name, Record), fill, drop_none)
        if not (drop_none and value is None):
            out[name] = value
    if fill and not drop_none:
        for name in sorted(record_type._optional):
            out.setdefault(name, None)
    return out


def _dumped_value(value: Any, record_type: type[Record], fill: bool, drop_none: bool) -> Any:
    if isinstance(value, Mapping):
        return _dumped(record_type, value, fill, drop_none)
    if isinstance(value, list):
        return [_dumped_value(item, record_type, fill, drop_none) for item in value]
    return value


def _wrap(value: Any, record_type: type[Record]) -> Any:
    if isinstance(value, Mapping):
        return record_type(value)
    if isinstance(value, list):
        return [_wrap(item, record_type) for item in value]
    return value


#: The key of a call's ``CallInfo`` in ``response.extensions``, on the responses the
#: transport hands openai-python (``stormguard.httpx_client()``) and on a raw
#: response's ``http_response``: ``response.extensions["stormguard"].attempts``.
CALL_INFO_EXTENSION = "stormguard"


class CallInfo:
    """What stormguard knows about the logical call that produced a result."""

    __slots__ = (
        "attempt_history",
        "degraded_from",
        "fallbacks",
        "model",
        "paced_429s",
        "precheck",
        "quota_wait_s",
        "rate_limit",
        "request_id",
        "server_load",
        "stop_reason",
    )

    def __init__(
        self,
        *,
        server_load: ServerLoad,
        attempt_history: tuple[AttemptRecord, ...],
        request_id: str | None,
        model: str | None,
        rate_limit: RateLimit | None = None,
    ) -> None:
        if rate_limit is None:
            from .rate_limit_headers import RateLimit

            rate_limit = RateLimit()
        self.server_load = server_load
        #: The ``x-ratelimit-*`` headers of the response (all None when not sent).
        self.rate_limit = rate_limit
        self.attempt_history = attempt_history
        self.request_id = request_id
        self.model = model
        #: The token pre-check (counts, window, counter name); None when none ran.
        self.precheck: Precheck | None = None
        #: The model first asked for, when a fallback model served the call because
        #: its own could not (overload, outage, open breaker).
        self.degraded_from: str | None = None
        #: Each move of the call to another model, with why (``FallbackStep``:
        #: ``from_model``, ``to_model``, ``kind``, ``error_type``; docs/providers.md).
        self.fallbacks: tuple[FallbackStep, ...] = ()
        #: Why the call stopped retrying, when it failed (``StopReason``); None when
        #: it succeeded. Set on the ``CallInfo`` of a failed call the transport answers.
        self.stop_reason: StopReason | None = None
        #: Seconds the call waited for its share of its API key's quota (all
        #: attempts), and the quota 429s it went back to the key's pacer after
        #: (docs/quotas.md).
        self.quota_wait_s = 0.0
        self.paced_429s = 0

    @property
    def attempts(self) -> int:
        """Number of HTTP attempts the call made."""
        return len(self.attempt_history)

    @property
    def deployment(self) -> str | None:
        """The ``Deployment`` of the call's last attempt (the one that answered, for a
        result); None: a plain endpoint, or no attempt (docs/providers.md)."""
        return self.attempt_history[-1].deployment if self.attempt_history else None

    @property
    def tier(self) -> int | None:
        """The tier of that deployment (None likewise)."""
        return self.attempt_history[-1].tier if self.attempt_history else None

    def __repr__(self) -> str:
        return (
            f"CallInfo(attempts={self.attempts}, request_id={self.request_id!r}, "
            f"server_load={self.server_load!r}"
            + (f", stop_reason={str(self.stop_reason)!r})" if self.stop_reason else ")")
        )


class APIResult(Record):
    """A top-level result: the JSON plus what the call went through to get it."""

    __slots__ = ("_info",)

    def __init__(self, data: Mapping[str, Any], info: CallInfo | None = None) -> None:
        super().__init__(data)
        self._info = info

    @property
    def call_info(self) -> CallInfo | None:
        """Attempts, load headers and request id of the call; None for a hand-built record."""
        return self._info

    @property
    def server_load(self) -> ServerLoad:
        """The load headers of the response that produced this result."""
        from ..protocol import ServerLoad

        return self._info.server_load if self._info is not None else ServerLoad()

    @property
    def rate_limit(self) -> RateLimit:
        """The ``x-ratelimit-*`` headers of the response: the caller's quota left."""
        from .rate_limit_headers import RateLimit

        return self._info.rate_limit if self._info is not None else RateLimit()

    @property
    def attempt_history(self) -> tuple[AttemptRecord, ...]:
        """Every HTTP attempt of the call, in order."""
        return self._info.attempt_history if self._info is not None else ()

    @property
    def attempts(self) -> int:
        """Number of HTTP attempts the call made."""
        return len(self.attempt_history)

    @property
    def deployment(self) -> str | None:
        """The ``Deployment`` of the call's last attempt (the one that answered, for a
        result); None: a plain endpoint, or no attempt (docs/providers.md)."""
        return self.attempt_history[-1].deployment if self.attempt_history else None

    @property
    def tier(self) -> int | None:
        """The tier of that deployment (None likewise)."""
        return self.attempt_history[-1].tier if self.attempt_history else None

    @property
    def degraded(self) -> bool:
        """True when a fallback model served the call (``served_model`` says which)."""
        return self._info is not None and self._info.degraded_from is not None

    @property
    def served_model(self) -> str | None:
        """The model the call was sent to last (the fallback when ``degraded``)."""
        return self._info.model if self._info is not None else None

    @property
    def precheck(self) -> Precheck | None:
        """The token pre-check of the call (counter used, prompt tokens, window)."""
        return self._info.precheck if self._info is not None else None

    @property
    def request_id(self) -> str | None:
        """The server's ``x-request-id`` for the attempt that succeeded."""
        return self._info.request_id if self._info is not None else None

    @property
    def _request_id(self) -> str | None:
        """openai-python's name for :attr:`request_id` (public there despite the underscore)."""
        return self.request_id


class CompletionUsage(Record):
    __slots__ = ()
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    completion_tokens_details: Record | None
    prompt_tokens_details: Record | None


class FunctionCall(Record):
    __slots__ = ()
    name: str
    arguments: str


class ToolCall(Record):
    """A tool call of a message, or a piece of one in a streamed delta (which has
    its ``index``)."""

    __slots__ = ()
    _nested = {"function": FunctionCall}
    id: str
    type: str
    function: FunctionCall
    #: A custom tool's call (``type="custom"``): its name and input.
    custom: Record | None
    index: int | None


class ChatCompletionMessage(Record):
    __slots__ = ()
    _nested = {"tool_calls": ToolCall, "function_call": FunctionCall}
    role: str
    content: str | None
    refusal: str | None
    tool_calls: list[ToolCall] | None
    function_call: FunctionCall | None
    annotations: list[Record] | None
    audio: Record | None


class Choice(Record):
    __slots__ = ()
    _nested = {"message": ChatCompletionMessage}
    index: int
    message: ChatCompletionMessage
    finish_reason: str | None
    logprobs: Record | None


class ChatCompletion(APIResult):
    """Result of ``chat.completions.create``."""

    __slots__ = ()
    _nested = {"choices": Choice, "usage": CompletionUsage}
    id: str
    object: str
    created: int
    model: str
    choices: list[Choice]
    usage: CompletionUsage | None
    system_fingerprint: str | None
    service_tier: str | None
    metadata: Record | None
    moderation: Record | None


class ChoiceDelta(Record):
    __slots__ = ()
    _nested = {"tool_calls": ToolCall, "function_call": FunctionCall}
    role: str | None
    content: str | None
    refusal: str | None
    tool_calls: list[ToolCall] | None
    function_call: FunctionCall | None
    audio: Record | None


class ChunkChoice(Record):
    __slots__ = ()
    _nested = {"delta": ChoiceDelta}
    index: int
    delta: ChoiceDelta
    finish_reason: str | None
    logprobs: Record | None


class ChatCompletionChunk(Record):
    """One event of a streamed chat completion."""

    __slots__ = ()
    _nested = {"choices": ChunkChoice, "usage": CompletionUsage}
    id: str
    object: str
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: CompletionUsage | None
    system_fingerprint: str | None
    service_tier: str | None
    moderation: Record | None
    obfuscation: str | None


class CompletionChoice(Record):
    __slots__ = ()
    index: int
    text: str
    finish_reason: str | None
    logprobs: Record | None


class Completion(APIResult):
    """Result of ``completions.create`` (and each event of its stream)."""

    __slots__ = ()
    _nested = {"choices": CompletionChoice, "usage": CompletionUsage}
    id: str
    object: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage | None
    system_fingerprint: str | None


class Model(APIResult):
    """A served model: an entry of ``models.list()``, and the result of
    ``models.retrieve(id)`` (which has the call's attempts and load headers)."""

    __slots__ = ()
    id: str
    object: str
    created: int
    owned_by: str
    shutdown_date: str | None
    #: Context window as vLLM reports it (absent on OpenAI).
    max_model_len: int | None


class ModelList(APIResult):
    """Result of ``models.list()``; iterating it yields the models."""

    __slots__ = ()
    _nested = {"data": Model}
    object: str
    data: list[Model]

    def __iter__(self) -> Iterator[Model]:
        return iter(self.data or [])

    def __len__(self) -> int:
        return len(self.data or [])


class EmbeddingUsage(Record):
    __slots__ = ()
    prompt_tokens: int
    total_tokens: int


class Embedding(Record):
    __slots__ = ()
    #: What a body may hold for a field, where it differs from the field's type.
    _field_shapes: ClassVar[Mapping[str, object]] = {"embedding": list[float] | str}
    #: The vector: floats, or the base64 text when ``encoding_format="base64"`` was asked.
    embedding: list[float]
    index: int
    object: str


class CreateEmbeddingResponse(APIResult):
    """Result of ``embeddings.create``."""

    __slots__ = ()
    _nested = {"data": Embedding, "usage": EmbeddingUsage}
    data: list[Embedding]
    model: str
    object: str
    usage: EmbeddingUsage


class ResponseUsage(Record):
    __slots__ = ()
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: Record
    output_tokens_details: Record


class Response(APIResult):
    """Result of ``responses.create`` (and the ``response`` of its stream's events).

    The output items stay plain records (messages, reasoning, tool calls: each
    has its ``type``); ``output_text`` joins the text of every ``output_text``
    part of every message, as openai-python's property does."""

    __slots__ = ()
    _nested = {"usage": ResponseUsage}
    id: str
    object: str
    created_at: float
    status: str | None
    error: Record | None
    incomplete_details: Record | None
    instructions: str | list[Record] | None
    max_output_tokens: int | None
    model: str
    output: list[Record]
    usage: ResponseUsage | None
    # The request's settings, echoed, and the rest of openai's fields.
    access_programs: Record | None
    background: bool | None
    completed_at: float | None
    conversation: Record | None
    image: Record | None
    input_transformations: list[Record] | None
    max_tool_calls: int | None
    metadata: Record | None
    moderation: Record | None
    parallel_tool_calls: bool | None
    previous_response_id: str | None
    prompt: Record | None
    prompt_cache_diagnostics: Record | None
    prompt_cache_key: str | None
    prompt_cache_options: Record | None
    prompt_cache_retention: str | None
    reasoning: Record | None
    safety_identifier: str | None
    service_tier: str | None
    temperature: float | None
    text: Record | None
    tool_choice: str | Record | None
    tool_usage: Record | None
    tools: list[Record] | None
    top_logprobs: int | None
    top_p: float | None
    truncation: str | None
    user: str | None

    @property
    def output_text(self) -> str:
        """The text of every ``output_text`` part of every output message, joined
        ("" when there is none)."""
        return output_text_of(self.get("output"))


def output_text_of(output: object) -> str:
    """The text of every ``output_text`` part of every message of a Responses API
    ``output`` list, joined ("" when there is none)."""
    texts: list[str] = []
    for item in output if isinstance(output, list) else ():
        if not isinstance(item, Mapping) or item.get("type") != "message":
            continue
        content = item.get("content")
        for part in content if isinstance(content, list) else ():
            if isinstance(part, Mapping) and part.get("type") == "output_text":
                text = part.get("text")
                if isinstance(text, str):
                    texts.append(text)
    return "".join(texts)


class ResponseStreamEvent(Record):
    """One event of a streamed ``responses.create``: its ``type`` says which
    (``response.created``, ``response.output_text.delta``, ...,
    ``response.completed``); the fields are that type's, and an event type
    stormguard does not know comes through the same way."""

    __slots__ = ()
    _nested = {"response": Response}
    type: str
    sequence_number: int
    response: Response | None
    #: Text, or (a shell call's output) an object.
    delta: str | Record | None
    text: str | None
    item_id: str | None
    output_index: int | None
    content_index: int | None
    item: Record | None
    part: Record | None
    # The fields of the other event types openai declares.
    annotation: Record | None
    annotation_index: int | None
    arguments: str | None
    background: str | None
    code: str | None
    command: str | None
    command_index: int | None
    input: str | None
    logprobs: list[Record] | None
    message: str | None
    obfuscation: str | None
    output: list[Record] | None
    output_format: str | None
    param: str | None
    partial_image_b64: str | None
    partial_image_index: int | None
    quality: str | None
    refusal: str | None
    size: str | None
    status: str | None
    summary_index: int | None
