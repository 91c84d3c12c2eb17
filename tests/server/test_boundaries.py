"""The server imports from the SDK only the wire protocol, the public version and
the public OTLP setup: it owns serving, and the SDK's insides may change freely.
Inside the server, each wing imports only the wings below it (docs/server.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import stormguard_server

ALLOWED = {"stormguard", "stormguard.protocol", "stormguard.telemetry"}
ALLOWED_NAMES = {"stormguard": {"__version__"}, "stormguard.telemetry": {"configure_otlp"}}


def _sdk_imports() -> list[tuple[str, str, tuple[str, ...]]]:
    found = []
    root = Path(stormguard_server.__file__).parent
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module == "stormguard" or node.module.startswith("stormguard."):
                    names = tuple(alias.name for alias in node.names)
                    found.append((str(path.relative_to(root)), node.module, names))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == "stormguard" or alias.name.startswith("stormguard."):
                        found.append((str(path.relative_to(root)), alias.name, ("*",)))
    return found


def test_the_server_imports_only_the_sdks_public_protocol_and_version() -> None:
    imports = _sdk_imports()
    assert imports, "the server reads the wire protocol from stormguard.protocol"
    wrong = [
        (path, module, names)
        for path, module, names in imports
        if module not in ALLOWED
        or (module in ALLOWED_NAMES and not set(names) <= ALLOWED_NAMES[module])
    ]
    assert wrong == []


#: The server's wings and top-level modules, lowest first. A module imports from its
#: own wing and the layers below, never from a peer or a layer above: every import
#: counts (module level, under ``TYPE_CHECKING`` and deferred inside a function).
LAYERS = [
    {"config", "clock"},
    {"engine"},
    {"admission", "telemetry"},
    {"http"},
    {"quota", "guards"},
    {"state"},
    {"api", "vllm"},
    {"app", "admin"},
    {"serving"},
    {"cli"},
    {"__init__", "__main__"},
]
RANK = {wing: rank for rank, layer in enumerate(LAYERS) for wing in layer}


def _wing(parts: list[str]) -> str:
    """``stormguard_server.api.generation`` is in ``api``; the package itself is ``__init__``."""
    return parts[1] if len(parts) > 1 else "__init__"


def _wing_imports() -> list[tuple[str, str]]:
    """(importing module, imported stormguard_server module) for every import statement."""
    root = Path(stormguard_server.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        parts = ["stormguard_server", *path.relative_to(root).with_suffix("").parts]
        package = parts[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                names = [".".join([*base, node.module] if node.module else base)]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            found += [(".".join(parts), name) for name in names if name.split(".")[0] == parts[0]]
    return found


def test_every_wing_imports_only_the_layers_below_it() -> None:
    imports = _wing_imports()
    assert len({module for module, _ in imports}) > 30
    assert {_wing(m.split(".")) for m, _ in imports} <= RANK.keys()
    upward = [
        (module, name)
        for module, name in imports
        if (here := _wing(module.split("."))) != (there := _wing(name.split(".")))
        and RANK[there] >= RANK[here]
    ]
    assert upward == []
