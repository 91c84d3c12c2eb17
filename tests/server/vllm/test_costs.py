"""What the vLLM middleware counts for each route, with a tokenizer whose counts are
easy to see: a token per word, one more (BOS) with special tokens, and a chat
template of two tokens per message plus two for the generation prompt."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stormguard_server.vllm.costs import Cost, request_cost

MAX_LEN = 100


class WordTokenizer:
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [0] * (len(text.split()) + add_special_tokens)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool,
        tokenize: bool,
        tools: list[dict[str, Any]] | None = None,
    ) -> dict[str, list[int]]:
        """Two tokens per message and its words; a tool, as chat templates list them:
        two tokens and the words of its JSON."""
        assert tokenize and add_generation_prompt
        words = sum(2 + len((m.get("content") or "").split()) for m in messages)
        words += sum(2 + len(json.dumps(tool).split()) for tool in tools or ())
        return {"input_ids": [0] * (words + 2)}  # a BatchEncoding, as transformers 5's


def cost(path: str, request: dict[str, Any]) -> Cost | None:
    return request_cost(path, request, WordTokenizer(), MAX_LEN)


@pytest.mark.parametrize(
    ("request_", "prompt_tokens"),
    [
        ({"input": "one two three"}, 2 + 3 + 2),
        ({"input": "one two", "instructions": "be brief"}, (2 + 2) + (2 + 2) + 2),
        # Empty instructions add no system message, as vLLM renders them.
        ({"input": "one two", "instructions": ""}, (2 + 2) + 2),
        ({"input": [{"role": "user", "content": "a b c"}]}, (2 + 3) + 2),
        (
            {
                "input": [
                    {"type": "message", "role": "user", "content": "a b"},
                    {"role": "assistant", "content": [{"type": "output_text", "text": "c"}]},
                    {"role": "user", "content": [{"type": "input_text", "text": "d e"}]},
                ],
                "instructions": "x",
            },
            (2 + 1) + (2 + 2) + (2 + 1) + (2 + 2) + 2,
        ),
        # Parts are joined by a newline (vLLM's way): "a\nb" is two words here.
        (
            {"input": [{"role": "user", "content": [{"text": "a"}, {"text": "b"}]}]},
            (2 + 2) + 2,
        ),
    ],
)
def test_a_responses_request_costs_its_conversation_and_max_output_tokens(
    request_: dict[str, Any], prompt_tokens: int
) -> None:
    assert cost("/v1/responses", {**request_, "max_output_tokens": 20}) == Cost(
        prompt_tokens, 20, "input"
    )
    # Without a limit it may generate what the context leaves.
    assert cost("/v1/responses", request_) == Cost(prompt_tokens, MAX_LEN - prompt_tokens, "input")


def test_a_responses_request_over_the_context_is_too_long() -> None:
    found = cost("/v1/responses", {"input": "a b c", "max_output_tokens": 95})
    assert found is not None and found.tokens == 7 + 95
    assert found.too_long is not None and "context length (100)" in found.too_long


@pytest.mark.parametrize(
    "request_",
    [
        {"input": []},
        {"input": 5},
        {"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]},
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
        {"input": [{"role": 1, "content": "x"}]},
        {"input": "x", "instructions": ["not", "text"]},
        {"input": "x", "max_output_tokens": 0},
        {"input": "x", "max_output_tokens": "5"},
        {"input": "x", "max_output_tokens": True},
    ],
)
def test_responses_shapes_not_counted_are_left_to_vllm(request_: dict[str, Any]) -> None:
    assert cost("/v1/responses", request_) is None


@pytest.mark.parametrize(
    ("request_", "prompt_tokens"),
    [
        ({"input": "one two three"}, 4),
        ({"input": ["one", "two three"]}, 2 + 3),
        ({"input": [5, 6, 7]}, 3),
        ({"input": [[5, 6], [7], "a b"]}, 2 + 1 + 3),
        ({"input": "one two three", "add_special_tokens": False}, 3),
    ],
)
def test_an_embeddings_request_costs_its_inputs_and_no_output(
    request_: dict[str, Any], prompt_tokens: int
) -> None:
    assert cost("/v1/embeddings", request_) == Cost(prompt_tokens, 0, "input")


def test_an_embeddings_input_over_the_context_is_too_long_unless_truncated() -> None:
    long = "w " * 150
    found = cost("/v1/embeddings", {"input": ["short", long]})
    assert found is not None and found.prompt_tokens == 2 + 151 and found.max_tokens == 0
    assert found.too_long is not None
    assert "requested 151 tokens in input 1" in found.too_long
    # vLLM truncates when asked: the cost is what it keeps.
    assert cost("/v1/embeddings", {"input": long, "truncate_prompt_tokens": -1}) == Cost(
        MAX_LEN, 0, "input"
    )
    assert cost("/v1/embeddings", {"input": long, "truncate_prompt_tokens": 10}) == Cost(
        10, 0, "input"
    )


@pytest.mark.parametrize(
    "request_",
    [
        {},
        {"input": []},
        {"input": ""},
        {"input": ["a", ""]},
        {"input": [["x"]]},
        {"input": [True, False]},
        {"messages": [{"role": "user", "content": "x"}]},
        {"input": "x", "truncate_prompt_tokens": "5"},
        {"input": "x", "add_special_tokens": "no"},
    ],
)
def test_embeddings_shapes_not_counted_are_left_to_vllm(request_: dict[str, Any]) -> None:
    assert cost("/v1/embeddings", request_) is None


def test_a_chat_requests_tools_are_prompt_tokens() -> None:
    """vLLM renders a request's tools with the chat template (each one's name, description
    and JSON Schema): admission counts them, or a request with large tools would be
    admitted at a fraction of the KV cache it takes."""
    messages = [{"role": "user", "content": "a b"}]
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with_tools = cost("/v1/chat/completions", {"messages": messages, "tools": [tool] * 3})
    assert with_tools is not None
    assert with_tools.prompt_tokens == 6 + 3 * (2 + len(json.dumps(tool).split()))
    assert cost("/v1/chat/completions", {"messages": messages, "tools": "f"}) is None


def test_chat_and_completions_as_before() -> None:
    messages = [{"role": "user", "content": "a b"}]
    assert cost("/v1/chat/completions", {"messages": messages, "max_tokens": 5}) == Cost(
        6, 5, "messages"
    )
    assert cost("/v1/chat/completions", {"messages": messages, "max_completion_tokens": 7}) == Cost(
        6, 7, "messages"
    )
    assert cost("/v1/completions", {"prompt": "a b", "max_tokens": 5}) == Cost(3, 5, "prompt")
    assert cost("/v1/completions", {"prompt": [1, 2]}) == Cost(2, MAX_LEN - 2, "prompt")
    assert cost("/v1/completions", {"prompt": ["a", "b"]}) is None
    assert cost("/v1/models", {}) is None
