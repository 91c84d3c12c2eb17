"""What one request to vLLM costs in KV tokens, counted as vLLM will count it.

The admission middleware asks ``request_cost`` before it lets a request through.
The cost is the reference server's: prompt tokens (with vLLM's own tokenizer
and the model's chat template) plus the tokens the request may generate. Per route:

* ``/v1/chat/completions``: ``messages`` and ``tools`` through the chat template,
  plus ``max_completion_tokens`` or ``max_tokens``;
* ``/v1/completions``: ``prompt`` (a string or token ids), plus ``max_tokens``;
* ``/v1/responses``: ``instructions`` as the system message and ``input`` (a string,
  or messages whose content is a string or text parts) through the chat template,
  plus ``max_output_tokens``, as the reference server counts it;
* ``/v1/embeddings``: the tokens of every ``input`` (strings or token ids) and
  nothing more: embeddings are a prefill alone.

Without a limit on its output, a request may generate what the context window
leaves, as vLLM lets it. ``None`` means the request has a shape this module does
not count (batches of prompts, tool items, chat-style embeddings, a malformed
field): the middleware hands it to vLLM unadmitted, and vLLM validates it.

Pure functions of the request, the tokenizer and ``max_model_len``: the
middleware calls them in a worker thread (tokenizing a long prompt takes
milliseconds), and tests call them with a fake tokenizer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

__all__ = ["ADMITTED_PATHS", "Cost", "request_cost"]

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
RESPONSES = "/v1/responses"
ADMITTED_PATHS = frozenset({CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES})


@dataclass(frozen=True, slots=True)
class Cost:
    """A request's admission cost. ``max_tokens`` is 0 for a prefill alone
    (embeddings). ``too_long`` is the refusal's message when the request can never
    fit the context window; ``param`` names the field that holds the prompt."""

    prompt_tokens: int
    max_tokens: int
    param: str
    too_long: str | None = None

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.max_tokens


def request_cost(
    path: str, request: Mapping[str, Any], tokenizer: Any, max_model_len: int
) -> Cost | None:
    """The cost of ``request`` sent to ``path`` (one of ``ADMITTED_PATHS``)."""
    if path == EMBEDDINGS:
        return _embeddings_cost(request, tokenizer, max_model_len)
    if path == CHAT:
        messages, tools = request.get("messages"), request.get("tools")
        if not isinstance(messages, list) or not isinstance(tools, list | None):
            return None
        prompt_tokens, param = _template_tokens(tokenizer, messages, tools), "messages"
        max_tokens = request.get("max_completion_tokens", request.get("max_tokens"))
    elif path == COMPLETIONS:
        prompt = request.get("prompt")
        if isinstance(prompt, str):
            prompt_tokens = len(tokenizer.encode(prompt))
        elif _is_token_ids(prompt):
            prompt_tokens = len(prompt)
        else:
            return None  # batches and the like: vLLM checks them itself
        param, max_tokens = "prompt", request.get("max_tokens")
    elif path == RESPONSES:
        conversation = _responses_messages(request)
        if conversation is None:
            return None
        prompt_tokens, param = _template_tokens(tokenizer, conversation), "input"
        max_tokens = request.get("max_output_tokens")
    else:
        return None
    return _generation_cost(prompt_tokens, max_tokens, param, max_model_len)


def _generation_cost(
    prompt_tokens: int, max_tokens: Any, param: str, max_model_len: int
) -> Cost | None:
    if max_tokens is None:
        # vLLM's default: whatever the context window leaves.
        max_tokens = max(max_model_len - prompt_tokens, 1)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        return None
    too_long = None
    if prompt_tokens + max_tokens > max_model_len:
        too_long = (
            f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds the"
            f" model's context length ({max_model_len})"
        )
    return Cost(prompt_tokens, max_tokens, param, too_long)


def _template_tokens(tokenizer: Any, messages: list[Any], tools: list[Any] | None = None) -> int:
    """The prompt's tokens as vLLM renders it: the chat template over the messages and,
    when the request has them, its tools (vLLM passes them to the template as ``tools``)."""
    extra = {"tools": tools} if tools else {}
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, **extra
    )
    # transformers 5 returns a BatchEncoding (a Mapping), older ones a list.
    return len(ids["input_ids"] if isinstance(ids, Mapping) else ids)


def _responses_messages(request: Mapping[str, Any]) -> list[dict[str, str]] | None:
    """The conversation vLLM renders for a Responses request: ``instructions`` (when not
    empty) as the system message, then ``input`` as one user message or as its
    messages. Items other than messages (tool calls, reasoning, files) are not
    counted here: None."""
    instructions = request.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        return None
    conversation = [{"role": "system", "content": instructions}] if instructions else []
    raw = request.get("input")
    if isinstance(raw, str):
        return [*conversation, {"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        return None
    for item in raw:
        if not isinstance(item, Mapping) or item.get("type", "message") != "message":
            return None
        role, content = item.get("role"), item.get("content")
        text = _text_of(content)
        if not isinstance(role, str) or text is None:
            return None
        conversation.append({"role": role, "content": text})
    return conversation


def _text_of(content: Any) -> str | None:
    """A message's text: a string, or text parts (``input_text``, ``output_text``)
    joined by newlines, as vLLM joins them for a chat template that takes a string
    (the reference server joins them with nothing: its own template, its own count)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    texts = [part.get("text") if isinstance(part, Mapping) else None for part in content]
    if not all(isinstance(text, str) for text in texts):
        return None
    return "\n".join(texts)  # type: ignore[arg-type]


def _embeddings_cost(request: Mapping[str, Any], tokenizer: Any, max_model_len: int) -> Cost | None:
    """The tokens of every input, no output tokens. An input longer than the context
    (after vLLM's ``truncate_prompt_tokens``, when the request asks for it) makes
    the request too long, in openai's words."""
    raw = request.get("input")
    items: list[Any]
    if isinstance(raw, str) or _is_token_ids(raw):
        items, single = [raw], True
    elif isinstance(raw, list) and raw:
        items, single = raw, False
    else:
        return None  # no input, or chat-style embeddings (messages): vLLM's to judge
    truncate = request.get("truncate_prompt_tokens")
    if truncate is not None and (not isinstance(truncate, int) or isinstance(truncate, bool)):
        return None
    special = request.get("add_special_tokens", True)
    if not isinstance(special, bool):
        return None
    counts: list[int] = []
    for item in items:
        if isinstance(item, str) and item:
            tokens = len(tokenizer.encode(item, add_special_tokens=special))
        elif _is_token_ids(item):
            tokens = len(item)
        else:
            return None  # empty or mixed inputs: vLLM answers its own 400
        if truncate is not None:
            tokens = min(tokens, max_model_len if truncate == -1 else max(truncate, 0))
        counts.append(tokens)
    too_long = None
    for index, tokens in enumerate(counts):
        if tokens > max_model_len:
            where = "" if single else f" in input {index}"
            too_long = (
                f"This model's maximum context length is {max_model_len} tokens. However, you"
                f" requested {tokens} tokens{where} for embedding generation. Please reduce"
                " the length of the input."
            )
            break
    return Cost(sum(counts), 0, "input", too_long)


def _is_token_ids(value: Any) -> TypeGuard[list[int]]:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(x, int) and not isinstance(x, bool) for x in value)
    )
