"""The import graph of each package: no cycles, and the layers keep to themselves.

Module-level imports only, read from the source (``if TYPE_CHECKING:`` blocks and
imports inside functions are not edges: the first never runs, the second runs after
every module is loaded, which is how optional dependencies load on first use). A
cycle here is a module that cannot be imported first without the other half-made.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = [
    ROOT / "sdk" / "stormguard",
    ROOT / "server" / "stormguard_server",
    ROOT / "bench" / "stormguard_drill",
]

#: The decisions of a call (retry, budget, breaker, throttle, limiter, deadline...)
#: judge outcomes and keep counts; they never touch the wire, so they can be tested
#: and reused without an HTTP library, and the sync and async clients share them.
DECISION_MODULES = [
    "stormguard._budget",
    "stormguard._breaker",
    "stormguard._clock",
    "stormguard._deadline",
    "stormguard._fallback",
    "stormguard._limiter",
    "stormguard._retry",
    "stormguard._stop_reason",
    "stormguard._throttle",
    "stormguard._verdict",
    "stormguard._sliding_window",
    "stormguard._aimd_limit",
    "stormguard._breaker_config",
    "stormguard._breaker_registry",
    "stormguard._breaker_states",
    "stormguard._circuit_breaker",
    "stormguard._endpoint_limit",
    "stormguard._lease",
    "stormguard._slot_waiter",
    "stormguard._ejection_config",
    "stormguard._ejection_rules",
    "stormguard._ejection_status",
    "stormguard._tiers",
    "stormguard._policies.quota",
    "stormguard._policies.quota._config",
    "stormguard._policies.quota._cubic",
    "stormguard._policies.quota._gate",
    "stormguard._policies.quota._key",
    "stormguard._policies.quota._redis",
    "stormguard._policies.quota._registry",
    "stormguard._policies.quota._share",
    "stormguard._policies.quota._shared",
    "stormguard._policies.quota._signals",
]
HTTP_LIBRARIES = {"httpx", "httpx2", "httpcore", "httpcore2", "h11"}


def _modules(package: Path) -> dict[str, Path]:
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _statements(nodes: Iterable[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements that run when the module is imported."""
    for node in nodes:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from _statements(node.orelse)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        elif isinstance(node, ast.ClassDef):
            yield from _statements(node.body)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            yield node
            for block in ("body", "orelse", "finalbody"):
                yield from _statements(getattr(node, block, []))
            for handler in getattr(node, "handlers", []):
                yield from _statements(handler.body)
        else:
            yield node


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every module ``name`` imports at import time (ours and others', top-level
    names for others')."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in _statements(ast.parse(path.read_text(encoding="utf-8")).body):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            submodules = {f"{source}.{a.name}" for a in node.names} & modules.keys()
            found.update(submodules)
            if len(submodules) < len(node.names):
                found.add(source)  # a name defined in ``source`` itself
    found.discard(name)
    return found


def import_graph(package: Path) -> dict[str, set[str]]:
    modules = _modules(package)
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each cycle met by a depth-first walk, as the path that closes it."""
    found: list[list[str]] = []
    done: set[str] = set()
    path: list[str] = []

    def walk(node: str) -> None:
        path.append(node)
        for nxt in sorted(graph[node] & graph.keys()):
            if nxt in path:
                found.append([*path[path.index(nxt) :], nxt])
            elif nxt not in done:
                walk(nxt)
        path.pop()
        done.add(node)

    for node in sorted(graph):
        if node not in done:
            walk(node)
    return found


def reach(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module imported, directly or not, when ``start`` is imported."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for nxt in graph.get(todo.pop(), set()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_no_import_cycles(package: Path) -> None:
    graph = import_graph(package)
    assert len(graph) > 10
    assert cycles(graph) == []


def test_a_cycle_is_found(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from . import a\n")
    (package / "a.py").write_text("from .sub import b\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from .. import c\n"  # never runs: no edge
        "def later():\n    from .. import c\n"  # runs after import: no edge
        "from ..a import name\n"
    )
    (package / "c.py").write_text("from . import a\n")
    graph = import_graph(package)
    assert graph["pkg.sub.b"] == {"typing", "pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.sub.b", "pkg.a"]]


@pytest.mark.parametrize("module", DECISION_MODULES)
def test_decisions_import_no_http_library(module: str) -> None:
    graph = import_graph(PACKAGES[0])
    imported = {name.split(".")[0] for name in reach(graph, module)}
    assert imported & HTTP_LIBRARIES == set()
