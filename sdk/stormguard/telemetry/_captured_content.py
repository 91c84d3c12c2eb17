"""The prompt and the answer as ``gen_ai.input.messages`` and
``gen_ai.output.messages`` JSON, recorded only when ``capture_content`` is on."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._events import ResponseSummary


def _input_messages(body: Mapping[str, Any]) -> str | None:
    """``gen_ai.input.messages`` (semconv v1.41.0 JSON shape: role + text parts)."""
    messages = body.get("messages")
    if isinstance(messages, list):
        out = []
        for message in messages:
            if isinstance(message, Mapping):
                content = message.get("content")
                text = content if isinstance(content, str) else json.dumps(content, default=str)
                out.append(
                    {
                        "role": str(message.get("role", "user")),
                        "parts": [{"type": "text", "content": text}],
                    }
                )
        return json.dumps(out, ensure_ascii=False)
    prompt = body.get("prompt")
    if prompt is None:
        return None
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, default=str)
    return json.dumps(
        [{"role": "user", "parts": [{"type": "text", "content": text}]}], ensure_ascii=False
    )


def _output_messages(response: ResponseSummary) -> str:
    reasons = response.finish_reasons
    return json.dumps(
        [
            {
                "role": "assistant",
                "parts": [{"type": "text", "content": text}],
                "finish_reason": reasons[i] if i < len(reasons) else "stop",
            }
            for i, text in enumerate(response.output_text)
        ],
        ensure_ascii=False,
    )
