"""Whether a decoded 2xx body has the shape a record type declares (``shape_problem``).

The records (``_core/results.py``) convert nothing until a field is read, so a body
of the wrong shape (``"choices": {"0": 1}``, ``"total_tokens": "3"``) would
surface as a ``KeyError`` or ``AttributeError`` wherever the caller first
reads it. The call checks the body once instead, against the fields each
record declares, and fails with ``APIResponseValidationError`` when one does
not fit; the caller then reads what it was promised. The rules, per declared
field, when the body has it:

* an ``int`` field takes a JSON integer (not ``"3"``, ``7.5`` or ``Infinity``,
  which Python's JSON reader lets through); a ``float`` field any number; a
  ``str`` field a string;
* a record field takes an object, checked in turn; a list field takes a list,
  each item checked (the items of a list of numbers are not: an embedding is
  thousands of them, and any list reads by index);
* ``null`` is taken where the type says ``| None``, and in a scalar field, where
  it reads as ``None``, as an absent field does; a record or list field that is
  not optional refuses it (``choices[0]`` must work).

An absent field is fine: it reads as ``None``. Fields a record does not declare
are not looked at (servers add their own). Hand-built records are not checked.

Streamed chunks are checked one by one, so the check is a table lookup per key
of the body (``fits``), the message found again only for a body that fails:
about 1 µs for a chat chunk, half of its ``json.loads``. A stream's chunks mostly
differ in one string (the token), so ``ChunkCheck`` skips the lookups for a chunk
that differs from the last ones that fit in that string only: about 0.25 µs
(docs/benchmarks.md, "Streaming").
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Mapping
from typing import Any, NamedTuple

from .fork import fork_safe_lock
from .results import Record

__all__ = ["ChunkCheck", "Shape", "fits", "misfit", "shape_of", "shape_problem"]


class _Field(NamedTuple):
    """What one declared field takes."""

    #: The JSON types taken as they are (``type(value)`` is one of them).
    plain: frozenset[type]
    #: The record an object (or each item of a list) is checked against.
    record: type[Record] | None
    #: ``record`` is a list's items' type, not the field's.
    many: bool
    #: What the field takes, in words (for the message).
    wanted: str


class Shape:
    """One record type's fields, as the check reads them: a field's plain JSON types
    first (nearly every value is one), then the shape of a nested record."""

    __slots__ = ("deep", "fields", "plain")

    def __init__(self, fields: dict[str, _Field]) -> None:
        self.fields = fields
        self.plain = {name: field.plain for name, field in fields.items()}
        self.deep = {
            name: (_shape(field.record), field.many)
            for name, field in fields.items()
            if field.record is not None
        }


_shapes: dict[type[Record], Shape] = {}
_lock = fork_safe_lock()
_NONE = type(None)
_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def shape_problem(record_type: type[Record], data: Mapping[str, Any]) -> str | None:
    """What in ``data`` (decoded JSON) does not fit the fields ``record_type``
    declares, as a short sentence naming the field's path (no value is quoted), or
    None when it fits."""
    return misfit(_shape(record_type), data)


def shape_of(record_type: type[Record]) -> Shape:
    """``record_type``'s shape, for a reader that checks many bodies (a stream)."""
    return _shape(record_type)


def misfit(shape: Shape, data: Mapping[str, Any]) -> str | None:
    """``shape_problem`` of a shape already found."""
    return None if fits(shape, data) else _misfit(shape, data, "")


def fits(shape: Shape, data: Mapping[str, Any]) -> bool:
    """Whether ``data`` fits: the fast path, run on every body and streamed chunk
    (``misfit`` says what does not fit, found again the slow way)."""
    plain = shape.plain
    for name, value in data.items():
        ok = plain.get(name)
        if ok is None or type(value) in ok:
            continue  # undeclared, or a scalar (or null) of its type: nearly every field
        deep = shape.deep.get(name)
        if deep is None:
            return False
        inner, many = deep
        if not many:
            if type(value) is not dict or not fits(inner, value):
                return False
        elif type(value) is not list:
            return False
        else:
            for item in value:
                if type(item) is not dict or not fits(inner, item):
                    return False
    return True


#: A chunk's text longer than this is not remembered: the memory a stream keeps is
#: bounded, and beside the parse of a long chunk its field check is small anyway.
_REMEMBERED_CHARS = 4096
#: Chunks in a row checked field by field, after which a stream stops looking for
#: the string its chunks differ in (each look is two splits and a compare).
_MAX_LOOKS = 4


class ChunkCheck:
    """``fits`` for the chunks of one stream, which skips the field-by-field check
    for a chunk that differs from one that passed it in one string value only.

    A stream's chunks mostly differ in one string (the token): once two chunks in a
    row that fit differ in one string value and nowhere else, the text before that
    string's content (``_head``, to its opening quote) and after it (``_tail``, from
    its closing quote) are remembered. They come from a text without ``\\"``, so
    none of their quotes is escaped. A chunk that is ``_head``, then text with no
    ``"``, then ``_tail``, and is valid JSON (it was decoded), has that string
    closed by the same quote: were that quote escaped (a ``\\`` before it), its
    text would have an odd number of quotes that are not, and no JSON has. So it
    has the same keys, nesting and value types around a string value as those
    chunks had: it fits as they did. Telling so is two compares and a search in C,
    about 0.25 us against 1 us for the fields of a chat chunk. Any other chunk is
    checked field by field (and a field that does not fit is named)."""

    __slots__ = ("_head", "_last", "_looks", "_tail", "shape")

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self._head: str | None = None
        self._tail = ""
        self._last: str | None = None  # the text of the last chunk that fit
        self._looks = 0

    def fits(self, text: str, data: Mapping[str, Any]) -> bool:
        """Whether ``data``, decoded from ``text``, fits the shape."""
        head, tail = self._head, self._tail
        if (
            head is not None
            and text.startswith(head)
            and text.endswith(tail)
            and len(text) >= len(head) + len(tail)
        ):
            middle = text[len(head) : len(text) - len(tail)]
            if '"' not in middle:
                self._looks = 0
                return True
        if not fits(self.shape, data):
            return False
        if self._looks < _MAX_LOOKS:
            self._looks += 1
            self._look(text)
        return True

    def _look(self, text: str) -> None:
        """Find the one string value ``text`` differs in from the last chunk that fit."""
        last, self._last = self._last, None
        if len(text) > _REMEMBERED_CHARS or '\\"' in text:
            return  # only a text without \" splits at quotes into strings and the rest
        if self._looks < _MAX_LOOKS:  # else the last look: nothing kept
            self._last = text  # the text, not its parts: a tenth of the memory
        if last is None:
            return
        parts = text.split('"')  # between strings, a string, between, a string, ...
        before = last.split('"')
        if len(before) != len(parts) or before[0::2] != parts[0::2]:
            return
        changed = [at for at in range(1, len(parts), 2) if parts[at] != before[at]]
        if len(changed) != 1 or parts[changed[0] + 1].lstrip().startswith(":"):
            return  # more strings than one changed, or a key did
        at = changed[0]
        self._head = '"'.join(parts[:at]) + '"'
        self._tail = '"' + '"'.join(parts[at + 1 :])


def _misfit(shape: Shape, data: Mapping[str, Any], path: str) -> str | None:
    """What does not fit in ``data``, found again the slow way for the message."""
    for name, value in data.items():
        field = shape.fields.get(name)
        if field is None or type(value) in field.plain:
            continue
        where = f"{path}.{name}" if path else name
        wrong = f"{where} must be {field.wanted}, got {_kind(value)}"
        if field.record is None:
            return wrong
        inner = _shape(field.record)
        if not field.many:
            if type(value) is not dict:
                return wrong
            problem = _misfit(inner, value, where)
        elif type(value) is not list:
            return wrong
        else:
            problem = _items_misfit(inner, value, where)
        if problem is not None:
            return problem
    return None


def _items_misfit(shape: Shape, items: list[Any], path: str) -> str | None:
    for index, item in enumerate(items):
        where = f"{path}[{index}]"
        if type(item) is not dict:
            return f"{where} must be an object, got {_kind(item)}"
        problem = _misfit(shape, item, where)
        if problem is not None:
            return problem
    return None


def _shape(record_type: type[Record]) -> Shape:
    """The shape of ``record_type``, made once per type (a fixed set: the record
    classes; their nesting has no cycle)."""
    shape = _shapes.get(record_type)
    if shape is not None:
        return shape
    overrides: Mapping[str, object] = getattr(record_type, "_field_shapes", {})
    shape = Shape(
        {
            name: _field(overrides.get(name, hint))
            for name, hint in typing.get_type_hints(record_type).items()
            if not name.startswith("_")
        }
    )
    with _lock:
        return _shapes.setdefault(record_type, shape)


def _field(hint: Any) -> _Field:
    """What a field of type ``hint`` takes."""
    options: tuple[Any, ...] = (hint,)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
    plain: set[type] = set()
    if all(option in _WORDS or option is _NONE for option in options):
        plain.add(_NONE)  # a null scalar reads as None, as an absent one does
    record: type[Record] | None = None
    many = False
    words = []
    for option in options:
        if option is _NONE:
            plain.add(_NONE)
            continue
        if option in _WORDS:
            plain.update((int, float) if option is float else (option,))
            words.append(_WORDS[option])
        elif typing.get_origin(option) is list:
            (item,) = typing.get_args(option) or (Any,)
            if isinstance(item, type) and issubclass(item, Record):
                record, many = item, True
            else:
                plain.add(list)  # a list of numbers: its items are not checked
            words.append("a list")
        elif isinstance(option, type) and issubclass(option, Record):
            record = option
            words.append("an object")
        else:
            raise TypeError(f"a record field of an unchecked type: {option!r}")
    return _Field(frozenset(plain), record, many, " or ".join(words))


def _kind(value: object) -> str:
    """A JSON value's kind, for a message (never the value itself)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number" if math.isfinite(value) else "Infinity or NaN"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"
