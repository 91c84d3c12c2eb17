"""Run compat examples in a process where httpx cannot be imported (``python -m
tests.compat.without_httpx FORM EXAMPLE...``): stormguard and openai-python 3.x on
httpx2 alone. Prints one JSON line: the library stormguard runs on, whether httpx
got imported after all, and per example what it ended with (``"ok"`` or the
exception's class name) and what it printed."""

from __future__ import annotations

import contextlib
import importlib.abc
import io
import json
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

BLOCKED = ("httpx", "httpcore")


class _NoHttpx(importlib.abc.MetaPathFinder):
    """As if httpx and httpcore were not installed."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname.split(".", 1)[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


def main(form_name: str, examples: list[str]) -> dict[str, object]:
    sys.meta_path.insert(0, _NoHttpx())
    from stormguard._core.http import httpx as library
    from tests.compat.forms import EXAMPLES, FORMS

    form = next(f for f in FORMS if f.name == form_name)
    outcomes: dict[str, dict[str, str]] = {}
    for example in examples:
        path = EXAMPLES / f"{example}.py"
        namespace: dict[str, object] = {"__name__": "__main__", "__file__": str(path)}
        out = io.StringIO()
        ended = "ok"
        with contextlib.redirect_stdout(out):
            try:
                exec(compile(form.source(example), str(path), "exec"), namespace)
            except Exception as exc:
                ended = type(exc).__name__
        client = namespace.get("client")
        close = getattr(client, "close", None)
        if callable(close) and not hasattr(client, "__aenter__"):
            close()
        outcomes[example] = {"ended": ended, "printed": out.getvalue()}
    return {
        "library": library.__name__,
        "httpx_imported": any(name in sys.modules for name in BLOCKED),
        "outcomes": outcomes,
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2:])))
