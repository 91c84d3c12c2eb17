"""What chat, completions and models send (``SpecBuilder``): the ``CallSpec`` of
each, with what every endpoint takes (the model, the timeout, the headers and the
query). ``_client/api_specs.py`` builds the other endpoints' specs on the same helpers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from .._core.results import (
    APIResult,
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    ModelList,
    Record,
)
from .._policies.hedge.policy import HedgePolicy, checked_hedge
from .._policies.routing.base_url import normalize_base_url
from .._policies.routing.deployment import Pin, pin_from_headers
from .arguments import CallExtras, CallTimeout, checked_stream_timeouts
from .call_spec import CallSpec
from .openai_conventions import (
    NOT_GIVEN,
    AttemptTimeouts,
    Unset,
    drop_omitted,
    is_omitted,
    path_with_query,
    split_timeout,
)
from .settings import ClientSettings
from .stream_timeouts import StreamTimeouts

__all__ = ["GenerationEndpoint", "SpecBuilder"]


@dataclass(frozen=True)
class GenerationEndpoint:
    """An endpoint that generates text: where it lives and what it returns."""

    path: str
    operation: str
    result_type: type[APIResult]
    chunk_type: type[Record]

    CHAT: ClassVar[GenerationEndpoint]
    COMPLETION: ClassVar[GenerationEndpoint]


GenerationEndpoint.CHAT = GenerationEndpoint(
    "chat/completions", "chat", ChatCompletion, ChatCompletionChunk
)
GenerationEndpoint.COMPLETION = GenerationEndpoint(
    "completions", "text_completion", Completion, Completion
)


class SpecBuilder(ClientSettings):
    """The call specs of chat, completions and models, from the client's settings."""

    def _timeout_for(self, timeout: CallTimeout) -> tuple[float | None, AttemptTimeouts | None]:
        if is_omitted(timeout):
            return self.timeout, None
        return split_timeout(timeout)

    def _model_for(self, model: str | None) -> str:
        chosen = (None if is_omitted(model) else model) or self.model
        if not chosen:
            raise ValueError("No model: pass model= to the call or to the client")
        return chosen

    def chat_spec(
        self,
        *,
        messages: Iterable[Mapping[str, Any]],
        model: str | None,
        stream: bool | None,
        extras: CallExtras,
        params: Mapping[str, Any],
        pin: Pin | None = None,
        stream_timeouts: StreamTimeouts | Unset | None = NOT_GIVEN,
        hedge: HedgePolicy | Unset | None = NOT_GIVEN,
    ) -> CallSpec:
        if isinstance(messages, (str, bytes, Mapping)):
            raise TypeError("messages must be a list of message dicts")
        message_list = list(messages)
        if not all(isinstance(m, Mapping) for m in message_list):
            raise TypeError("each message must be a dict with 'role' and 'content'")
        return self._generation_spec(
            GenerationEndpoint.CHAT, "messages", drop_omitted(message_list), model, stream,
            extras, params, pin, stream_timeouts, hedge,
        )  # fmt: skip

    def completion_spec(
        self,
        *,
        prompt: str | list[str] | list[int],
        model: str | None,
        stream: bool | None,
        extras: CallExtras,
        params: Mapping[str, Any],
        pin: Pin | None = None,
        stream_timeouts: StreamTimeouts | Unset | None = NOT_GIVEN,
        hedge: HedgePolicy | Unset | None = NOT_GIVEN,
    ) -> CallSpec:
        return self._generation_spec(
            GenerationEndpoint.COMPLETION, "prompt", prompt, model, stream, extras, params,
            pin, stream_timeouts, hedge,
        )  # fmt: skip

    def _generation_spec(
        self,
        endpoint: GenerationEndpoint,
        input_field: str,
        input_value: object,
        model: str | None,
        stream: bool | None,
        extras: CallExtras,
        params: Mapping[str, Any],
        pin: Pin | None,
        stream_timeouts: StreamTimeouts | Unset | None,
        hedge: HedgePolicy | Unset | None = NOT_GIVEN,
    ) -> CallSpec:
        chosen = self._model_for(model)
        streaming = bool(stream) and not is_omitted(stream)
        body: dict[str, Any] = {"model": chosen, input_field: input_value}
        body.update(drop_omitted(params))
        if extras.extra_body:
            body.update(drop_omitted(extras.extra_body))
        if streaming:
            body["stream"] = True
        return self._spec(
            extras,
            method="POST",
            path=endpoint.path,
            result_type=endpoint.result_type,
            operation=endpoint.operation,
            body=body,
            stream=streaming,
            chunk_type=endpoint.chunk_type,
            model=chosen,
            pin=pin,
            hedge=hedge,
            stream_timeouts=(
                None  # the client's
                if is_omitted(stream_timeouts)
                else checked_stream_timeouts(stream_timeouts) or StreamTimeouts()
            ),
        )

    def models_spec(self, *, extras: CallExtras) -> CallSpec:
        return self._spec(
            extras, method="GET", path="models", result_type=ModelList, operation="models"
        )

    def _spec(
        self,
        extras: CallExtras,
        *,
        path: str,
        pin: Pin | Unset | None = NOT_GIVEN,
        hedge: HedgePolicy | Unset | None = NOT_GIVEN,
        **fields: Any,
    ) -> CallSpec:
        """The spec with what every endpoint takes: the timeout, the headers and the
        query (``default_query`` and ``extra_query``, in the URL as openai sends it),
        the tier or deployment it is pinned to (``pin``, or its headers), its
        affinity key and its hedging (``hedge``, else the client's; with several
        endpoints)."""
        total, limits = self._timeout_for(extras.timeout)
        pinned, headers = pin_from_headers(
            {
                name: value
                for name, value in (extras.extra_headers or {}).items()
                if not is_omitted(value)
            }
        )
        if not is_omitted(pin) and pin is not None:
            if not isinstance(pin, Pin):
                raise TypeError(f"pin must be a stormguard.Pin or None, got {type(pin).__name__}")
            pinned = pin
        if pinned is not None:
            self.check_pin(pinned)
        keys = self.affinity_keys
        if keys is not None:
            fields["affinity_key"] = keys.key_of(fields.get("body"))
        if not is_omitted(hedge):
            hedge = checked_hedge(hedge)
            fields["hedge"] = hedge if self.several_endpoints else None
        elif self.hedge_calls is not None:
            fields["hedge"] = self.hedge_calls
        return CallSpec(
            path=path_with_query(path, self.default_query, extras.extra_query),
            timeout=total,
            attempt_timeouts=limits,
            headers=headers,
            pin=pinned,
            **fields,
        )

    def check_pin(self, pin: Pin) -> None:
        """A clear error for a pin no endpoint of the client matches."""
        if pin.tier is not None:
            if not any(getattr(e, "tier", 1) == pin.tier for e in self.endpoints):
                tiers = sorted({getattr(e, "tier", 1) for e in self.endpoints})
                raise ValueError(f"no endpoint of this client is of tier {pin.tier} ({tiers=})")
        elif pin.deployment not in {
            e.name or normalize_base_url(e.base_url)[1] for e in self.endpoints
        }:
            raise ValueError(f"no endpoint of this client is named {pin.deployment!r}")
