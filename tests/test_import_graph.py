"""The import graph of each package: no cycles, and the layers keep to themselves.

Two graphs, read from the source. The runtime one has module-level imports only
(``if TYPE_CHECKING:`` blocks never run, and imports inside functions run after every
module is loaded, as optional dependencies load on first use): a cycle there is a
module that cannot be imported first without the other half-made. The whole one has
every import statement: a cycle there, even through a type or a deferred import, is
two modules that cannot be read, tested or moved one without the other.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Collection, Iterable, Iterator, Sequence
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
    "stormguard._policies.retry.budget",
    "stormguard._policies.breaker",
    "stormguard._core.clock",
    "stormguard._core.deadline",
    "stormguard._policies.fallback",
    "stormguard._policies.limiter.limiter",
    "stormguard._policies.retry.retry",
    "stormguard._core.stop_reason",
    "stormguard._policies.retry.throttle",
    "stormguard._core.verdict",
    "stormguard._core.sliding_window",
    "stormguard._policies.limiter.aimd",
    "stormguard._policies.breaker.config",
    "stormguard._policies.breaker.registry",
    "stormguard._policies.breaker.states",
    "stormguard._policies.breaker.circuit",
    "stormguard._policies.limiter.endpoint_limit",
    "stormguard._policies.limiter.lease",
    "stormguard._policies.limiter.slot_waiter",
    "stormguard._policies.routing.affinity",
    "stormguard._policies.routing.affinity_config",
    "stormguard._policies.routing.ejection_config",
    "stormguard._policies.routing.ejection_rules",
    "stormguard._policies.routing.ejection_status",
    "stormguard._policies.routing.tiers",
    "stormguard._policies.hedge",
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


def _every_import(nodes: Iterable[ast.stmt]) -> Iterator[ast.stmt]:
    """Every import statement, wherever it is."""
    for node in nodes:
        yield from (n for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom)))


def _imports(name: str, path: Path, modules: dict[str, Path], every: bool) -> dict[str, int]:
    """Every module ``name`` imports (ours and others', top-level names for others'),
    with the line of its first import: at import time, or ``every`` import."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: dict[str, int] = {}
    body = ast.parse(path.read_text(encoding="utf-8")).body
    for node in (_every_import if every else _statements)(body):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.setdefault(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            submodules = {f"{source}.{a.name}" for a in node.names} & modules.keys()
            for submodule in sorted(submodules):
                found.setdefault(submodule, node.lineno)
            if len(submodules) < len(node.names):
                found.setdefault(source, node.lineno)  # a name defined in ``source`` itself
    found.pop(name, None)
    return found


def import_lines(package: Path, every: bool = False) -> dict[str, dict[str, int]]:
    """Each module's imports, with the line of each (``every``: not only at import
    time)."""
    modules = _modules(package)
    return {name: _imports(name, path, modules, every) for name, path in modules.items()}


def import_graph(package: Path, every: bool = False) -> dict[str, set[str]]:
    return {name: set(lines) for name, lines in import_lines(package, every).items()}


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


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _closing(package: Path, lines: dict[str, dict[str, int]], cycle: list[str]) -> str:
    """A cycle, each step with the import that makes it (file:line)."""
    modules = _modules(package)
    steps = [
        f"{a} -> {b} ({_shown(modules[a])}:{lines[a][b]})" for a, b in itertools.pairwise(cycle)
    ]
    return "\n  ".join(steps)


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
@pytest.mark.parametrize("every", [False, True], ids=["at-import", "every-import"])
def test_no_import_cycles(package: Path, every: bool) -> None:
    lines = import_lines(package, every)
    graph = {name: set(imported) for name, imported in lines.items()}
    assert len(graph) > 10
    found = cycles(graph)
    assert not found, "import cycle:\n  " + _closing(package, lines, found[0])


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
    # Counting every import, the type-only and the deferred one are edges too.
    every = import_lines(package, every=True)
    assert every["pkg.sub.b"] == {"typing": 1, "pkg.c": 3, "pkg.a": 6}
    closed = ["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]
    assert closed in cycles(import_graph(package, every=True))
    # A failure names the import that makes each step, with its file and line.
    where = _closing(package, every, closed).replace(str(tmp_path) + "/", "")
    assert "pkg.sub.b -> pkg.c (" in where and "pkg/sub/b.py:3)" in where


@pytest.mark.parametrize("module", DECISION_MODULES)
def test_decisions_import_no_http_library(module: str) -> None:
    graph = import_graph(PACKAGES[0])
    imported = {name.split(".")[0] for name in reach(graph, module)}
    assert imported & HTTP_LIBRARIES == set()


#: Modules whose job is to pick an implementation and hand it on: ``_core.http`` (httpx or
#: httpx2), ``_core.compat`` (``typing`` or ``typing_extensions``).
PICKERS = {"stormguard._core.http", "stormguard._core.compat"}


def _defined(path: Path) -> set[str]:
    """The names a module defines itself (not those it imports), at its top level or
    in its top-level ``if``/``try`` blocks."""
    names: set[str] = set()
    todo = list(ast.parse(path.read_text(encoding="utf-8")).body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.Try)):
            for block in ("body", "orelse", "finalbody"):
                todo.extend(getattr(node, block, []))
            for handler in getattr(node, "handlers", []):
                todo.extend(handler.body)
    return names


def through_reexports(package: Path) -> list[str]:
    """Each import of a name from one of our modules that does not define it (it
    imported it from another), as ``file:line: name from module``. A package's
    ``__init__`` may re-export."""
    modules = _modules(package)
    defined = {name: _defined(path) for name, path in modules.items()}
    found = []
    for name, path in modules.items():
        pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in _every_import(ast.parse(path.read_text(encoding="utf-8")).body):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = pkg[: len(pkg) - node.level + 1] if node.level else []
            source = ".".join(base + ([node.module] if node.module else []))
            if source not in modules or source in PICKERS:
                continue
            if modules[source].name == "__init__.py":
                continue
            for alias in node.names:
                if f"{source}.{alias.name}" in modules or alias.name in defined[source]:
                    continue
                found.append(f"{_shown(path)}:{node.lineno}: {alias.name} from {source}")
    return found


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_names_are_imported_from_the_module_that_defines_them(package: Path) -> None:
    assert through_reexports(package) == []


def test_an_import_through_a_reexport_is_found(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from .low import Thing\n")  # allowed
    (package / "low.py").write_text("class Thing: ...\n")
    (package / "mid.py").write_text("from .low import Thing\n")
    (package / "top.py").write_text("from .mid import Thing\nfrom .low import Thing as T\n")
    assert [line.split(": ", 1)[1] for line in through_reexports(package)] == ["Thing from pkg.mid"]


#: The SDK's packages from the bottom up: a module imports from its own package, from
#: a package below it, or from the public modules at the top of ``stormguard``.
WINGS = [
    "stormguard._core",
    "stormguard._policies.retry",
    "stormguard._io",
    "stormguard._policies.breaker",
    "stormguard._policies.limiter",
    "stormguard._policies.routing",
    "stormguard._policies.hedge",
    "stormguard.tokens",
    "stormguard._policies.quota",
    "stormguard.telemetry",
    "stormguard._policies",
    "stormguard._call",
    "stormguard._client",
    "stormguard._transport",
]


def _wing(module: str, layers: Sequence[Collection[str]]) -> tuple[int, str] | None:
    """The layer and the wing of ``module``: the innermost wing (a package or a module
    named in ``layers``) that holds it."""
    held = [(rank, w) for rank, wings in enumerate(layers) for w in wings]
    held = [(rank, w) for rank, w in held if module == w or module.startswith(w + ".")]
    return max(held, key=lambda found: len(found[1])) if held else None


def upward_imports(package: Path, layers: Sequence[Collection[str]]) -> list[str]:
    """Each import, of any kind and anywhere, from a module to a wing of its own layer or
    one above (``layers`` lowest first), as ``file:line: module -> imported``. A module
    imports freely inside its own wing; a module in no wing is not judged."""
    modules = _modules(package)
    upward = []
    for name, imported in import_lines(package, every=True).items():
        mine = _wing(name, layers)
        for other, line in imported.items():
            theirs = _wing(other, layers)
            if mine is None or theirs is None or theirs[1] == mine[1]:
                continue
            if theirs[0] >= mine[0]:
                upward.append(f"{_shown(modules[name])}:{line}: {name} -> {other}")
    return upward


def test_each_sdk_package_imports_only_the_ones_below_it() -> None:
    upward = upward_imports(PACKAGES[0], [{wing} for wing in WINGS])
    assert not upward, "imports up or across:\n" + "\n".join(upward)


#: What reads a drill run's results: the figures, and the records they read. None of
#: them reaches a runner (which starts servers and processes), by any import, so each
#: can be read, tested and moved without the machinery that filled the records.
DRILL_FIGURES = [
    "stormguard_drill.figures",
    "stormguard_drill.records",
    "stormguard_drill.summary",
    "stormguard_drill.fleet.client_records",
    "stormguard_drill.fleet.fault_figures",
    "stormguard_drill.fleet.records",
    "stormguard_drill.fleet.replica_series",
    "stormguard_drill.fleet.summary",
    "stormguard_drill.fleet.targets",
    "stormguard_drill.quota.records",
    "stormguard_drill.quota.summary",
    "stormguard_drill.outage.records",
    "stormguard_drill.outage.summary",
]
DRILL_RUNNERS = {
    "stormguard_drill.cli",
    "stormguard_drill.runner",
    "stormguard_drill.fleet.drill",
    "stormguard_drill.fleet.runner",
    "stormguard_drill.fleet.worker",
    "stormguard_drill.quota.drill",
    "stormguard_drill.quota.runner",
    "stormguard_drill.quota.worker",
    "stormguard_drill.outage.drill",
    "stormguard_drill.outage.runner",
}


@pytest.mark.parametrize("module", DRILL_FIGURES)
def test_the_drills_figures_reach_no_runner(module: str) -> None:
    graph = import_graph(PACKAGES[2], every=True)
    assert module in graph
    assert reach(graph, module) & DRILL_RUNNERS == set()
