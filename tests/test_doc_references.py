"""Where docstrings and docs name one of our modules, that module is there.

Modules move (``_responses`` became ``_io/decoding.py``); prose that names the old
place goes on reading as true until someone follows it. This reads every quoted name
in the three packages' sources and in the docs: a path (``_io/pool_life.py``), a
module and what it defines (``verdict.classify``), or a dotted name
(``stormguard._core.verdict``), and checks each against the tree. Names of other
projects' modules (``retries/adaptive.py`` is botocore's) start with no folder of
ours, and are left alone.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {
    "stormguard": ROOT / "sdk" / "stormguard",
    "stormguard_server": ROOT / "server" / "stormguard_server",
    "stormguard_drill": ROOT / "bench" / "stormguard_drill",
}
SOURCES = [ROOT / d for d in ("sdk", "server", "bench", "tests", "examples", "scripts")]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_QUOTED_PY = re.compile(r"``([^`\s]+)``")  # reStructuredText literals in docstrings
_QUOTED_MD = re.compile(r"(?<!`)`([^`\s]+)`(?!`)")  # Markdown code spans
_PATH = re.compile(r"^(?:[\w.-]+/)*[\w-]+\.py$")
_DOTTED = re.compile(r"^(stormguard(?:_server|_drill)?)((?:\.\w+)+)$")
_MEMBER = re.compile(r"^(\w+)\.(\w+)$")


def _python_files() -> Iterator[Path]:
    for root in SOURCES:
        for path in root.rglob("*.py"):
            if ".venv" not in path.parts and "__pycache__" not in path.parts:
                yield path


def _code(path: Path) -> str:
    """``path``'s source without its docstrings and comments."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        value = first.value if isinstance(first, ast.Expr) else None
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            body[0] = ast.Pass()
    return ast.unparse(tree)


class Tree:
    """Our modules: by path, by stem, and the names each defines."""

    def __init__(self) -> None:
        self.paths = {p.relative_to(ROOT).as_posix() for p in _python_files()}
        self.folders = {part for path in self.paths for part in Path(path).parts[:-1]} - {
            "tests",
            ".",
        }
        self.stems: dict[str, list[Path]] = defaultdict(list)
        for package in PACKAGES.values():
            for path in package.rglob("*.py"):
                if "__pycache__" not in path.parts:
                    stem = path.parent.name if path.name == "__init__.py" else path.stem
                    self.stems[stem].append(path)
        self._defined: dict[Path, set[str]] = {}
        #: Every identifier the packages' code uses (``_request_id``, ``_replay``).
        self.words = {
            word
            for package in PACKAGES.values()
            for path in package.rglob("*.py")
            for word in re.findall(r"\b_\w+", _code(path))
        }

    def defines(self, module: Path, name: str) -> bool:
        if module not in self._defined:
            names: set[str] = set()
            for node in ast.walk(ast.parse(module.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(node.name)
                elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    names.add(node.id)
                elif isinstance(node, ast.alias):
                    names.add((node.asname or node.name).split(".")[0])
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    names.add(node.target.id)
            if module.name == "__init__.py":
                names |= {p.stem for p in module.parent.glob("*.py")}
                names |= {p.name for p in module.parent.iterdir() if p.is_dir()}
            self._defined[module] = names
        return name in self._defined[module]

    def path_exists(self, quoted: str) -> bool:
        return any(path == quoted or path.endswith("/" + quoted) for path in self.paths)

    def dotted_exists(self, package: str, rest: str) -> bool:
        """``package.a.b.c``: the longest prefix that is a module, then names in it."""
        parts = rest.strip(".").split(".")
        base = PACKAGES[package]
        for cut in range(len(parts), -1, -1):
            where = base.joinpath(*parts[:cut])
            module = where.with_suffix(".py") if cut else base / "__init__.py"
            if cut and not module.exists():
                module = where / "__init__.py"
            if module.exists():
                return cut == len(parts) or self.defines(module, parts[cut])
        return False


TREE = Tree()


def _quoted(path: Path) -> Iterator[tuple[int, str]]:
    pattern = _QUOTED_MD if path.suffix == ".md" else _QUOTED_PY
    for number, line in enumerate(path.read_text().splitlines(), 1):
        for match in pattern.finditer(line):
            yield number, match.group(1).rstrip(".,:;()")


def _aliases(path: Path) -> set[str]:
    """Names a module binds to modules it imports (``import fork as _fork``)."""
    if path.suffix != ".py":
        return set()
    text = path.read_text()
    return set(re.findall(r"\bimport \w+ as (\w+)", text)) | set(
        re.findall(r"^\s*from \S+ import (\w+)\s*$", text, re.M)
    )


def broken_references(path: Path) -> Iterator[str]:
    aliases = _aliases(path)
    for number, quoted in _quoted(path):
        where = f"{path.relative_to(ROOT)}:{number}: {quoted}"
        if _PATH.match(quoted):
            first = quoted.split("/")[0]
            ours = "/" in quoted and (first in TREE.folders or first in ("sdk", "server", "bench"))
            if ours and not TREE.path_exists(quoted):
                yield where + " (no such file)"
            continue
        dotted = _DOTTED.match(quoted)
        if dotted:
            package, rest = dotted.groups()
            if not _is_a_name_not_a_module(rest) and not TREE.dotted_exists(package, rest):
                yield where + " (no such module or name)"
            continue
        member = _MEMBER.match(quoted)
        stem = member.group(1) if member else quoted
        if not stem.startswith("_") or stem in aliases or stem in TREE.stems:
            continue
        if stem.lstrip("_") in TREE.stems and (member or stem not in TREE.words):
            yield where + f" (the module is {stem.lstrip('_')}, not {stem})"
        elif member and stem[1:2].islower():  # ``_Flight.end`` is a class's
            yield where + f" (no module {stem})"


#: Logger names kept from before their modules moved, so that users' logging
#: configuration goes on working.
LOGGERS = {"stormguard._breaker", "stormguard._ejection", "stormguard._discovery"}


def _is_a_name_not_a_module(rest: str) -> bool:
    """Dotted names with no private part are span attributes and metrics
    (``stormguard.client.attempts``) or the public API, which its own tests hold."""
    return not any(part.startswith("_") for part in rest.split(".")) or (
        "stormguard" + rest in LOGGERS
    )


FILES = sorted((set(_python_files()) | set(DOCS)) - {Path(__file__).resolve()})


def test_every_module_a_docstring_or_a_doc_names_is_there() -> None:
    broken = [line for path in FILES for line in broken_references(path)]
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("see ``_io/pool_life.py``", False),
        ("see ``_io/pool_lives.py``", True),
        ("``verdict.classify`` decides", False),
        ("``_verdict.classify`` decides", True),
        ("kept per loop (``_pool_life``)", True),
        ("``_transport_answers.raised_for``", True),
        ("``_Flight.end`` is a class's", False),
        ("``stormguard._core.verdict.classify``", False),
        ("``stormguard._core.verdicts``", True),
        ("botocore's ``retries/adaptive.py``", False),
    ],
)
def test_a_moved_module_is_found(tmp_path: Path, text: str, found: bool) -> None:
    page = ROOT / "tests" / f"_doc_reference_probe_{tmp_path.name}.py"
    page.write_text(f'"""{text}"""\n')
    try:
        assert bool(list(broken_references(page))) is found
    finally:
        page.unlink()
