"""A JSON Schema a request gives for its output (``response_format``, a tool's
``parameters``), checked before anything is generated from it.

The subset is OpenAI's structured outputs': the types ``object``, ``array``,
``string``, ``number``, ``integer``, ``boolean``, ``null`` (or a list of them),
``enum``, ``const``, ``anyOf`` (and ``oneOf``, and ``allOf`` of one schema, the
shapes pydantic writes), ``$ref`` into the same document (``$defs``,
``definitions``, ``#`` itself: recursion), ``properties``, ``required``,
``additionalProperties``, ``items``, ``prefixItems``, ``minItems``,
``maxItems``, ``uniqueItems``, ``pattern``, ``format``, ``minLength``,
``maxLength``, ``minimum``, ``maximum``, ``exclusiveMinimum``,
``exclusiveMaximum``, ``multipleOf``. The keywords in ``UNSUPPORTED`` are refused
by name; any other keyword is an annotation (``title``, ``description``,
``default``...), as JSON Schema says of unknown ones. ``strict: true`` adds
OpenAI's strict rules: the root is an object, every object has
``additionalProperties: false`` and lists every property in ``required``.

Bounds, so that a hostile schema costs a refusal and never a hang: OpenAI's own
(5,000 properties, 1,000 enum values, 120,000 characters of names and enum and
const strings), a JSON nesting of at most ``MAX_JSON_DEPTH`` checked without
recursion before anything recursive reads the schema, and patterns of at most
``MAX_PATTERN_LENGTH`` characters. The validator is jsonschema-rs (Rust): its
meta-schema check names what is malformed, it never fetches a remote ``$ref``
(``offline``), and its regular expressions run in linear time or under a
backtracking limit, so a pattern built for catastrophic backtracking cannot
stall a check.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import jsonschema_rs

MAX_JSON_DEPTH = 64
MAX_PROPERTIES = 5_000
MAX_ENUM_VALUES = 1_000
MAX_SCHEMA_STRINGS = 120_000
MAX_PATTERN_LENGTH = 4_096
_BACKTRACK_LIMIT = 100_000

TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
UNSUPPORTED = frozenset(
    {
        "not",
        "if",
        "then",
        "else",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "patternProperties",
        "propertyNames",
        "unevaluatedProperties",
        "unevaluatedItems",
        "minProperties",
        "maxProperties",
        "contains",
        "minContains",
        "maxContains",
        "additionalItems",
        "$anchor",
        "$dynamicRef",
        "$dynamicAnchor",
        "$recursiveRef",
        "$recursiveAnchor",
        "$vocabulary",
        "contentSchema",
    }
)
# Keywords whose value is one subschema, a list of them, or a map of names to them.
_ONE = ("items", "additionalProperties")
_MANY = ("anyOf", "oneOf", "allOf", "prefixItems")
_NAMED = ("properties", "$defs", "definitions")

Context = tuple[str, ...]


class SchemaRefused(Exception):
    """A schema this server will not answer, with where in it (``context``, OpenAI's
    word) and why. ``message(subject)`` is the 400's text."""

    def __init__(self, what: str, context: Context = ()) -> None:
        super().__init__(what)
        self.what = what
        self.context = context

    def message(self, subject: str) -> str:
        return f"Invalid schema for {subject}: In context={self.context!r}, {self.what}"


@dataclass(frozen=True, slots=True)
class CheckedSchema:
    """A schema that passed every check, and its compiled validator."""

    root: dict[str, Any]
    validator: jsonschema_rs.Validator

    def first_error(self, document: Any) -> str | None:
        """Why ``document`` is not valid, or None when it is."""
        for error in self.validator.iter_errors(document):
            return error.message
        return None


def check_schema(schema: Any, *, strict: bool) -> CheckedSchema:
    """``schema`` checked against the subset, the bounds and (``strict``) OpenAI's strict
    rules; raises ``SchemaRefused``."""
    if not isinstance(schema, dict):
        raise SchemaRefused("the schema must be a JSON object")
    depth = _json_depth(schema)
    if depth > MAX_JSON_DEPTH:
        raise SchemaRefused(f"the schema is nested {depth} levels deep (at most {MAX_JSON_DEPTH})")
    # Read as JSON Schema 2020-12 whatever ``$schema`` says: one dialect, the walk's.
    root = {key: value for key, value in schema.items() if key != "$schema"}
    if strict and (root.get("type") != "object" or "anyOf" in root):
        raise SchemaRefused("the root must be an object (`type: object`), not anyOf")
    tally = _Tally()
    for node, context in _subschemas(root):
        _check_node(node, context, root, strict=strict, tally=tally)
    tally.check()
    try:
        jsonschema_rs.meta.validate(root)
    except jsonschema_rs.ValidationError as exc:
        where = tuple(str(part) for part in exc.instance_path)
        raise SchemaRefused(f"it is not a valid JSON Schema: {exc.message}", where) from None
    try:
        validator = jsonschema_rs.Draft202012Validator(
            root,
            validate_formats=True,
            offline=True,
            pattern_options=jsonschema_rs.FancyRegexOptions(backtrack_limit=_BACKTRACK_LIMIT),
        )
    except (jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError, ValueError) as exc:
        raise SchemaRefused(f"it cannot be compiled: {_first_line(exc)}") from None
    return CheckedSchema(root, validator)


def resolve_ref(root: dict[str, Any], ref: str) -> Any:
    """The subschema a local ``$ref`` (a JSON pointer into ``root``) names; KeyError
    when it names nothing."""
    if not ref.startswith("#"):
        raise KeyError(ref)
    node: Any = root
    pointer = unquote(ref[1:])
    if not pointer:
        return node
    if not pointer.startswith("/"):
        raise KeyError(ref)
    for raw in pointer[1:].split("/"):
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        # ASCII digits only: str.isdigit takes "¹" too, which int() does not.
        elif isinstance(node, list) and part.isascii() and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise KeyError(ref)
    return node


@dataclass
class _Tally:
    properties: int = 0
    enum_values: int = 0
    strings: int = 0

    def check(self) -> None:
        if self.properties > MAX_PROPERTIES:
            raise SchemaRefused(
                f"it has {self.properties} object properties (at most {MAX_PROPERTIES})"
            )
        if self.enum_values > MAX_ENUM_VALUES:
            raise SchemaRefused(
                f"it has {self.enum_values} enum values (at most {MAX_ENUM_VALUES})"
            )
        if self.strings > MAX_SCHEMA_STRINGS:
            raise SchemaRefused(
                f"its property names, definition names, enum and const values add up to"
                f" {self.strings} characters (at most {MAX_SCHEMA_STRINGS})"
            )


def _json_depth(value: Any) -> int:
    """How deeply objects and arrays nest in ``value``, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_JSON_DEPTH:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _subschemas(root: dict[str, Any]) -> Iterator[tuple[Any, Context]]:
    """Every subschema of ``root`` with its context, without recursion."""
    stack: list[tuple[Any, Context]] = [(root, ())]
    while stack:
        node, context = stack.pop()
        yield node, context
        if not isinstance(node, dict):
            continue
        for key in _ONE:
            if isinstance(node.get(key), dict | bool):
                stack.append((node[key], (*context, key)))
        for key in _MANY:
            if isinstance(node.get(key), list):
                stack.extend((child, (*context, key, str(i))) for i, child in enumerate(node[key]))
        for key in _NAMED:
            if isinstance(node.get(key), dict):
                stack.extend((child, (*context, key, name)) for name, child in node[key].items())


def _check_node(
    node: Any, context: Context, root: dict[str, Any], *, strict: bool, tally: _Tally
) -> None:
    if isinstance(node, bool):
        return
    if not isinstance(node, dict):
        raise SchemaRefused("a subschema must be an object or a boolean", context)
    for keyword in node:
        if keyword in UNSUPPORTED:
            raise SchemaRefused(f"'{keyword}' is not supported", context)
    kind = node.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    for one in kinds:
        if not isinstance(one, str) or one not in TYPES:
            raise SchemaRefused(f"type {one!r} is not a JSON Schema type", context)
    ref = node.get("$ref")
    if ref is not None:
        try:
            resolve_ref(root, ref if isinstance(ref, str) else "")
        except KeyError:
            raise SchemaRefused(
                f"'$ref' {ref!r} does not resolve to anything in this schema", context
            ) from None
    all_of = node.get("allOf")
    if isinstance(all_of, list) and len(all_of) != 1:
        raise SchemaRefused("'allOf' is supported with exactly one subschema", context)
    pattern = node.get("pattern")
    if isinstance(pattern, str) and len(pattern) > MAX_PATTERN_LENGTH:
        raise SchemaRefused(f"'pattern' is over {MAX_PATTERN_LENGTH} characters", context)
    _count(node, tally)
    if strict and (kind == "object" or "properties" in node):
        _check_strict_object(node, context)


def _count(node: dict[str, Any], tally: _Tally) -> None:
    for key in _NAMED:
        names = node.get(key)
        if isinstance(names, dict):
            tally.strings += sum(len(name) for name in names)
            if key == "properties":
                tally.properties += len(names)
    enum = node.get("enum")
    if isinstance(enum, list):
        tally.enum_values += len(enum)
        tally.strings += sum(len(value) for value in enum if isinstance(value, str))
    const = node.get("const")
    if isinstance(const, str):
        tally.strings += len(const)


def _check_strict_object(node: dict[str, Any], context: Context) -> None:
    if node.get("additionalProperties") is not False:
        raise SchemaRefused(
            "'additionalProperties' is required to be supplied and to be false", context
        )
    properties = node.get("properties")
    names = list(properties) if isinstance(properties, dict) else []
    required = node.get("required")
    listed = (
        {name for name in required if isinstance(name, str)}
        if isinstance(required, list)
        else set()
    )
    missing = [name for name in names if name not in listed]
    if not isinstance(required, list) or missing:
        raise SchemaRefused(
            "'required' is required to be supplied and to be an array including every key"
            f" in properties. Missing {missing[0]!r}."
            if missing
            else "'required' is required to be supplied and to be an array including every"
            " key in properties.",
            context,
        )


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
