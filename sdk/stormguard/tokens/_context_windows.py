"""Context windows of well-known OpenAI models: the last resort after config and the server.

Values are OpenAI's published context windows (input + output, in tokens), checked
against the model pages in 2026. A serving deployment's own ``max_model_len`` wins
over this table whenever the server reports it.
"""

from __future__ import annotations

__all__ = ["KNOWN_CONTEXT_WINDOWS", "known_context_window"]

#: Model name (or family prefix, matched at a ``-`` boundary) → context window.
KNOWN_CONTEXT_WINDOWS: dict[str, int] = {
    "gpt-5": 400_000,
    "gpt-4.1": 1_047_576,
    "gpt-4.5-preview": 128_000,
    "gpt-4o": 128_000,
    "gpt-4o-mini": 128_000,
    "chatgpt-4o-latest": 128_000,
    "gpt-4-turbo": 128_000,
    "gpt-4-turbo-preview": 128_000,
    "gpt-4-0125-preview": 128_000,
    "gpt-4-1106-preview": 128_000,
    "gpt-4-vision-preview": 128_000,
    "gpt-4-32k": 32_768,
    "gpt-4": 8_192,
    "gpt-3.5-turbo": 16_385,
    "gpt-3.5-turbo-instruct": 4_096,
    "gpt-3.5-turbo-0613": 4_096,
    "gpt-3.5-turbo-0301": 4_096,
    "gpt-35-turbo": 16_385,
    "o1": 200_000,
    "o1-pro": 200_000,
    "o1-mini": 128_000,
    "o1-preview": 128_000,
    "o3": 200_000,
    "o3-mini": 200_000,
    "o3-pro": 200_000,
    "o4-mini": 200_000,
}

# Longest first, so "gpt-4o-mini" is tried before "gpt-4o" and "gpt-4-32k" before "gpt-4".
_BY_LENGTH = sorted(KNOWN_CONTEXT_WINDOWS, key=len, reverse=True)


def known_context_window(model: str) -> int | None:
    """The published window of ``model`` (dated snapshots match their family), or None."""
    name = model.rsplit("/", 1)[-1].lower()
    if name.startswith("ft:"):  # fine-tunes: "ft:gpt-4o-mini-2024-07-18:org::id"
        name = name[3:].split(":", 1)[0]
    for key in _BY_LENGTH:
        if name == key or name.startswith(key + "-"):
            return KNOWN_CONTEXT_WINDOWS[key]
    return None
