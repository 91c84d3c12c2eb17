"""Which tiktoken encoding an OpenAI model name uses."""

from __future__ import annotations

import tiktoken.model

__all__ = ["encoding_name_for_model"]

# Families tiktoken's table (0.14) does not name without a suffix, e.g. a bare "o4"
# or "gpt-4.5". Checked after tiktoken's own table, so tiktoken stays the authority.
_EXTRA_PREFIXES = (
    ("gpt-4o", "o200k_base"),
    ("gpt-4.5", "o200k_base"),
    ("gpt-4.1", "o200k_base"),
    ("gpt-5", "o200k_base"),
    ("o1", "o200k_base"),
    ("o3", "o200k_base"),
    ("o4", "o200k_base"),
    ("gpt-4", "cl100k_base"),
    ("gpt-3.5", "cl100k_base"),
    ("gpt-35", "cl100k_base"),
)


def encoding_name_for_model(model: str) -> str | None:
    """The tiktoken encoding name for ``model``, or None for a non-OpenAI model.

    A provider prefix is ignored (``"openai/gpt-4o"`` and ``"azure/gpt-4o"`` are
    ``gpt-4o``), and the match is case-insensitive.
    """
    name = model.rsplit("/", 1)[-1].lower()
    try:
        return tiktoken.model.encoding_name_for_model(name)
    except KeyError:
        pass
    for prefix, encoding in _EXTRA_PREFIXES:
        if name == prefix or name.startswith(prefix + "-"):
            return encoding
    return None
