"""A short string that a JSON Schema ``pattern`` accepts, for structured output.

No library fits at run time: rstr's ``xeger`` and exrex expand every ``*`` and
``+`` up to 100 times and ``{n}`` n times, so ``((a*)*)*`` or ``a{1000000}`` make
a string of megabytes, and exrex draws from the global ``random``. This walks
the pattern as CPython's own parser reads it (``re._parser``, ``sre_parse``
before 3.11) and takes each repeat's minimum plus at most two, from the caller's
``random.Random``: the same seed gives the same string. Lookarounds and
backreferences to groups not yet seen are not honoured; the caller validates
the result and tries another seed (``schema_values.py``). Every walk is bounded
in characters and in steps, so a hostile pattern costs a refusal, not a hang.
"""

from __future__ import annotations

import random
import re
import string
import sys
from typing import Any

if sys.version_info >= (3, 11):
    from re import _parser as sre_parse
else:  # pragma: no cover - Python 3.10
    import sre_parse

MAX_CHARS = 1024  # a pattern's string is one value of a document: it stays short
MAX_STEPS = 20_000  # nodes of the parsed pattern visited, repeats included
# The parser and the walk recurse once per group: bounded here, not by whatever
# recursion limit the process runs with.
MAX_GROUP_DEPTH = 64
_EXTRA_REPEATS = 2

_READABLE = string.ascii_lowercase + string.digits
_CATEGORIES: dict[str, str] = {
    "CATEGORY_DIGIT": string.digits,
    "CATEGORY_NOT_DIGIT": string.ascii_letters,
    "CATEGORY_SPACE": " ",
    "CATEGORY_NOT_SPACE": string.ascii_letters + string.digits,
    "CATEGORY_WORD": string.ascii_letters + string.digits + "_",
    "CATEGORY_NOT_WORD": "-. ",
}
_FALLBACK = string.ascii_letters + string.digits + " -_.:/@#"


class PatternRefused(Exception):
    """The pattern cannot be read, or its shortest strings are over the bounds."""


def string_for(pattern: str, rng: random.Random) -> str:
    """A string ``pattern`` probably matches (``re.search`` semantics: anchors are
    honoured by producing nothing around the match)."""
    if _group_depth(pattern) > MAX_GROUP_DEPTH:
        raise PatternRefused(f"the pattern nests groups over {MAX_GROUP_DEPTH} deep")
    try:
        parsed = sre_parse.parse(pattern)
    except (re.error, RecursionError, OverflowError, ValueError) as exc:
        raise PatternRefused(f"pattern {pattern[:80]!r} cannot be read: {exc}") from None
    walk = _Walk(rng)
    try:
        walk.sequence(parsed.data)
    except RecursionError:
        raise PatternRefused(f"pattern {pattern[:80]!r} is nested too deeply") from None
    return "".join(walk.out)


class _Walk:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.out: list[str] = []
        self.length = 0
        self.steps = 0
        self.groups: dict[int, str] = {}

    def emit(self, text: str) -> None:
        self.length += len(text)
        if self.length > MAX_CHARS:
            raise PatternRefused(f"a string this pattern accepts is over {MAX_CHARS} characters")
        self.out.append(text)

    def step(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise PatternRefused(f"the pattern takes over {MAX_STEPS} steps to expand")

    def sequence(self, items: list[tuple[Any, Any]]) -> None:
        for op, value in items:
            self.step()
            self.node(op.name, value)

    def node(self, name: str, value: Any) -> None:
        if name == "LITERAL":
            self.emit(chr(value))
        elif name == "NOT_LITERAL":
            self.emit(self._other_than({chr(value)}))
        elif name == "ANY":
            self.emit(self.rng.choice(_READABLE))
        elif name == "IN":
            self.emit(self._one_of(value))
        elif name == "BRANCH":
            self.sequence(list(self.rng.choice(value[1])))
        elif name == "SUBPATTERN":
            group, _add_flags, _del_flags, inner = value
            start = len(self.out)
            self.sequence(list(inner))
            if group is not None:
                self.groups[group] = "".join(self.out[start:])
        elif name in ("ATOMIC_GROUP",):
            self.sequence(list(value))
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, high, inner = value
            extra = min(_EXTRA_REPEATS, high - low)
            times = low + (self.rng.randint(0, extra) if extra > 0 else 0)
            for _ in range(times):
                self.step()  # an empty body repeated a million times costs its steps too
                self.sequence(list(inner))
        elif name == "GROUPREF":
            self.emit(self.groups.get(value, ""))
        elif name == "GROUPREF_EXISTS":
            group, yes, no = value
            chosen = yes if group in self.groups else no
            if chosen is not None:
                self.sequence(list(chosen))
        elif name in ("AT", "ASSERT", "ASSERT_NOT"):
            pass  # anchors match where the string starts and ends; lookarounds: see above
        else:
            raise PatternRefused(f"the pattern uses {name}, which this server cannot expand")

    def _one_of(self, items: list[tuple[Any, Any]]) -> str:
        """One character of a class ``[...]``."""
        negated = bool(items) and items[0][0].name == "NEGATE"
        if negated:
            return self._other_than_class(items[1:])
        op, value = self.rng.choice(items)
        name = op.name
        if name == "LITERAL":
            return chr(value)
        if name == "RANGE":
            low, high = value
            return chr(self.rng.randint(low, min(high, low + 25)))
        if name == "CATEGORY":
            return self.rng.choice(_CATEGORIES.get(value.name, _FALLBACK))
        return self.rng.choice(_FALLBACK)

    def _other_than(self, excluded: set[str]) -> str:
        choices = [c for c in _READABLE if c not in excluded]
        return self.rng.choice(choices or list(_FALLBACK))

    def _other_than_class(self, items: list[tuple[Any, Any]]) -> str:
        """A character outside a negated class: the first readable one it leaves out."""
        for candidate in self.rng.sample(_FALLBACK, len(_FALLBACK)):
            if not any(_in_item(candidate, op.name, value) for op, value in items):
                return candidate
        raise PatternRefused("a negated character class leaves no readable character")


def _in_item(char: str, name: str, value: Any) -> bool:
    if name == "LITERAL":
        return char == chr(value)
    if name == "RANGE":
        return bool(value[0] <= ord(char) <= value[1])
    if name == "CATEGORY":
        members = {
            "CATEGORY_DIGIT": char.isdigit(),
            "CATEGORY_NOT_DIGIT": not char.isdigit(),
            "CATEGORY_SPACE": char.isspace(),
            "CATEGORY_NOT_SPACE": not char.isspace(),
            "CATEGORY_WORD": char.isalnum() or char == "_",
            "CATEGORY_NOT_WORD": not (char.isalnum() or char == "_"),
        }
        return members.get(value.name, False)
    return False


def _group_depth(pattern: str) -> int:
    """How deeply ``(`` groups nest, escapes and character classes skipped."""
    depth = deepest = 0
    escaped = in_class = False
    for char in pattern:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif char == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif char == ")":
            depth -= 1
    return deepest
