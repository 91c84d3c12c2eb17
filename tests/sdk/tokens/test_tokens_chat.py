"""Chat prompts counted by OpenAI's published per-message rules."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stormguard.tokens import (
    OPENAI_OVERHEAD,
    ChatOverhead,
    TiktokenCounter,
    count_chat_tokens,
)
from stormguard.tokens._chat import IMAGE_PART_TOKENS
from tests.sdk.tokens.test_tokens_support import ENCODINGS, SAMPLES, cookbook_num_tokens

# The cookbook's example conversation, for which the OpenAI API reported 129 prompt
# tokens on gpt-3.5-turbo-0613, gpt-4-0314 and gpt-4-0613, and 124 on gpt-4o.
COOKBOOK_MESSAGES = [
    {
        "role": "system",
        "content": "You are a helpful, pattern-following assistant that translates corporate"
        " jargon into plain English.",
    },
    {
        "role": "system",
        "name": "example_user",
        "content": "New synergies will help drive top-line growth.",
    },
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Things working well together will increase revenue.",
    },
    {
        "role": "system",
        "name": "example_user",
        "content": "Let's circle back when we have more bandwidth to touch base on opportunities"
        " for increased leverage.",
    },
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Let's talk later when we're less busy about how to do better.",
    },
    {
        "role": "user",
        "content": "This late pivot means we don't have time to boil the ocean for the client"
        " deliverable.",
    },
]


@pytest.mark.parametrize(("encoding", "api_count"), [("cl100k_base", 129), ("o200k_base", 124)])
def test_cookbook_example_matches_the_api_counts(encoding: str, api_count: int) -> None:
    assert TiktokenCounter(encoding).count_messages(COOKBOOK_MESSAGES) == api_count


ROLES = st.sampled_from(["system", "user", "assistant"])
TEXT = st.one_of(st.sampled_from(sorted(SAMPLES.values())), st.text(max_size=80))
MESSAGE = st.one_of(
    st.fixed_dictionaries({"role": ROLES, "content": TEXT}),
    st.fixed_dictionaries(
        {"role": ROLES, "content": TEXT, "name": st.from_regex(r"[a-z_]{1,12}", fullmatch=True)}
    ),
)


@settings(max_examples=40, deadline=None)
@given(messages=st.lists(MESSAGE, max_size=6))
def test_string_messages_follow_the_cookbook(messages: list[dict[str, str]]) -> None:
    for name in ENCODINGS:
        counter = TiktokenCounter(name)
        assert counter.count_messages(messages) == cookbook_num_tokens(messages, counter.encoding)


def test_text_parts_count_like_the_joined_string() -> None:
    counter = TiktokenCounter("o200k_base")
    parts = [{"type": "text", "text": SAMPLES["ascii"]}, {"type": "text", "text": SAMPLES["cjk"]}]
    as_parts = counter.count_messages([{"role": "user", "content": parts}])
    as_text = 3 + 1 + counter.count_text(SAMPLES["ascii"]) + counter.count_text(SAMPLES["cjk"]) + 3
    assert as_parts == as_text


def test_an_image_part_costs_the_largest_high_detail_image() -> None:
    counter = TiktokenCounter("o200k_base")
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    with_image = counter.count_messages([{"role": "user", "content": [image]}])
    assert with_image == 3 + counter.count_text("user") + IMAGE_PART_TOKENS + 3


def test_tool_calls_and_function_calls_count_at_least_their_json() -> None:
    counter = TiktokenCounter("cl100k_base")
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    base = counter.count_messages([{"role": "assistant", "content": None}])
    with_call = counter.count_messages(
        [{"role": "assistant", "content": None, "tool_calls": [call]}]
    )
    assert with_call - base >= counter.count_text(json.dumps([call], separators=(",", ":")))
    legacy = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    with_legacy = counter.count_messages(
        [{"role": "assistant", "content": None, "function_call": legacy}]
    )
    assert with_legacy - base >= counter.count_text(legacy["name"] + legacy["arguments"])
    tool_reply = counter.count_messages(
        [{"role": "tool", "tool_call_id": "call_1", "content": "18C"}]
    )
    assert tool_reply == 3 + sum(counter.count_text(v) for v in ("tool", "call_1", "18C")) + 3


WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a given location.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "The city and state."},
                "unit": {
                    "type": "string",
                    "description": "Unit.",
                    "enum": ["celsius", "fahrenheit"],
                },
            },
            "required": ["location"],
        },
    },
}


def _cookbook_tool_tokens(counter: TiktokenCounter) -> int:
    """The cookbook's tool formula for WEATHER_TOOL, written out by hand (gpt-4 constants)."""
    count = counter.count_text
    return (
        10
        + count("get_current_weather:Get the current weather in a given location")
        + 3
        + 3
        + count("location:string:The city and state")
        + 3
        - 3
        + 3
        + count("celsius")
        + 3
        + count("fahrenheit")
        + count("unit:string:Unit")
        + 12
    )


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_tool_definitions_count_at_least_the_cookbook_and_their_json(encoding: str) -> None:
    counter = TiktokenCounter(encoding)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    tools_cost = counter.count_messages(messages, tools=[WEATHER_TOOL]) - counter.count_messages(
        messages
    )
    as_json = counter.count_text(json.dumps(WEATHER_TOOL, separators=(",", ":")))
    assert tools_cost >= _cookbook_tool_tokens(counter)
    assert tools_cost >= as_json + 10 + 12
    assert tools_cost == max(_cookbook_tool_tokens(counter), as_json + 10 + 12)


def test_overhead_is_configurable() -> None:
    count = len
    messages = [{"role": "user", "name": "ab", "content": "xyz"}]
    assert count_chat_tokens(messages, count) == 3 + 4 + 2 + 1 + 3 + 3
    custom = ChatOverhead(tokens_per_message=5, tokens_per_name=0, reply_priming=0)
    assert count_chat_tokens(messages, count, overhead=custom) == 5 + 4 + 2 + 3
    assert ChatOverhead() == OPENAI_OVERHEAD
