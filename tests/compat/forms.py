"""The two forms each compat example runs in, and how one becomes the other.

An example imports from stormguard (``from stormguard import OpenAI``, ``import
stormguard as openai``): that is its ``stormguard`` form, run as written. Its
``openai_over_stormguard`` form is the same text with those import lines pointed at
tests/compat/openai_over_stormguard.py (openai-python's clients over
``stormguard.httpx_client``, ``max_retries=0``); no other line changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import openai

import stormguard

EXAMPLES = Path(__file__).with_name("examples")
TRANSPORT_MODULE = "tests.compat.openai_over_stormguard"

# The import lines an example may use, and what each becomes in the transport form.
_REWRITES = (
    ("import stormguard as openai", f"import {TRANSPORT_MODULE} as openai"),
    ("from stormguard import ", f"from {TRANSPORT_MODULE} import "),
)


def example_names() -> list[str]:
    """Every example in tests/compat/examples, by file name."""
    return sorted(p.stem for p in EXAMPLES.glob("*.py") if p.stem != "__init__")


def over_transport(source: str) -> str:
    """``source`` with its stormguard imports pointed at the transport form's module.

    A ValueError when it has none: an example that imports nothing from stormguard
    would run the same in both forms and prove nothing about the second."""
    lines = source.splitlines(keepends=True)
    changed = 0
    for index, line in enumerate(lines):
        for old, new in _REWRITES:
            if line.startswith(old):
                lines[index] = new + line[len(old) :]
                changed += 1
    if not changed:
        raise ValueError("the example imports nothing from stormguard")
    return "".join(lines)


@dataclass(frozen=True)
class Form:
    """One way to run the examples: its name, and the module its errors come from."""

    name: str
    errors: ModuleType

    def source(self, example: str) -> str:
        text = (EXAMPLES / f"{example}.py").read_text()
        return text if self.errors is stormguard else over_transport(text)


STORMGUARD = Form("stormguard", stormguard)
OPENAI_OVER_STORMGUARD = Form("openai_over_stormguard", openai)
FORMS = (STORMGUARD, OPENAI_OVER_STORMGUARD)
