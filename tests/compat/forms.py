"""The three forms each compat example runs in, and how one becomes another.

An example imports from stormguard (``from stormguard import OpenAI``, ``import
stormguard as openai``): that is its ``stormguard`` form, run as written, on
``stormguard.OpenAI`` (openai's client over stormguard's pipeline, where openai is
installed). Its ``stormguard_client`` form points those import lines at
tests/compat/stormguard_client.py (stormguard's own ``Client`` under openai's names,
what ``stormguard.OpenAI`` is without openai), and its ``openai_over_stormguard`` form
at tests/compat/openai_over_stormguard.py (openai-python's clients over
``stormguard.httpx_client``, openai's retries at their default); no other line changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import openai

import stormguard

EXAMPLES = Path(__file__).with_name("examples")
TRANSPORT_MODULE = "tests.compat.openai_over_stormguard"
CLIENT_MODULE = "tests.compat.stormguard_client"


def example_names() -> list[str]:
    """Every example in tests/compat/examples, by file name."""
    return sorted(p.stem for p in EXAMPLES.glob("*.py") if p.stem != "__init__")


def over_transport(source: str, module: str = TRANSPORT_MODULE) -> str:
    """``source`` with its stormguard imports pointed at ``module`` (the transport
    form's, by default).

    A ValueError when it has none: an example that imports nothing from stormguard
    would run the same in every form and prove nothing about the others."""
    rewrites = (
        ("import stormguard as openai", f"import {module} as openai"),
        ("from stormguard import ", f"from {module} import "),
    )
    lines = source.splitlines(keepends=True)
    changed = 0
    for index, line in enumerate(lines):
        for old, new in rewrites:
            if line.startswith(old):
                lines[index] = new + line[len(old) :]
                changed += 1
    if not changed:
        raise ValueError("the example imports nothing from stormguard")
    return "".join(lines)


@dataclass(frozen=True)
class Form:
    """One way to run the examples: its name, the module its errors come from, and the
    module its stormguard imports are pointed at (None: as written)."""

    name: str
    errors: ModuleType
    module: str | None = None

    def source(self, example: str) -> str:
        text = (EXAMPLES / f"{example}.py").read_text()
        return text if self.module is None else over_transport(text, self.module)


STORMGUARD = Form("stormguard", stormguard)
STORMGUARD_CLIENT = Form("stormguard_client", stormguard, CLIENT_MODULE)
OPENAI_OVER_STORMGUARD = Form("openai_over_stormguard", openai, TRANSPORT_MODULE)
FORMS = (STORMGUARD, STORMGUARD_CLIENT, OPENAI_OVER_STORMGUARD)
