"""The server imports from the SDK only the wire protocol, the public version and
the public OTLP setup: it owns serving, and the SDK's insides may change freely."""

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
