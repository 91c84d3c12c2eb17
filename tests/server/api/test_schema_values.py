"""Documents drawn from JSON Schemas (``schema_check.py``, ``schema_values.py``,
``regex_values.py``): any schema of the supported subset gets a document that the
``jsonschema`` package (another implementation than the server's validator)
accepts, the same for the same seed; any hostile schema gets a refusal or a
bounded document, quickly."""

from __future__ import annotations

import json
import random
import re
import time
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stormguard_server.api.regex_values import PatternRefused, string_for
from stormguard_server.api.schema_check import SchemaRefused, check_schema
from stormguard_server.api.schema_values import MAX_CHARS, document

PATTERNS = [
    r"^\d{3}-\d{4}$",
    r"^[A-Z]{2}[a-z]*$",
    r"^[a-z0-9_.-]+@[a-z]+\.(com|org)$",
    r"^(?:yes|no|maybe)$",
    r"colou?r",
    r"^[^\s]{2,5}$",
    r"^#[0-9a-fA-F]{6}$",
]
FORMATS = ["date-time", "date", "time", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"]
NAMES = st.text(alphabet="abcdefghijklmnop_", min_size=1, max_size=8)


@st.composite
def integers(draw: st.DrawFn) -> dict[str, Any]:
    low = draw(st.integers(-1000, 1000))
    step = draw(st.sampled_from([None, 1, 2, 5, 7]))
    width = draw(st.integers(step or 0, 500))
    schema: dict[str, Any] = {"type": "integer"}
    if draw(st.booleans()):
        schema["minimum"] = low
    if draw(st.booleans()):
        schema["maximum"] = low + width
    if step:
        schema["multipleOf"] = step
    return schema


@st.composite
def numbers(draw: st.DrawFn) -> dict[str, Any]:
    low = draw(st.floats(-1e6, 1e6, allow_nan=False))
    width = draw(st.floats(1.5, 1e6))  # an open interval this wide holds a multiple of 0.5
    schema: dict[str, Any] = {"type": "number"}
    if draw(st.booleans()):
        schema["exclusiveMinimum" if draw(st.booleans()) else "minimum"] = low
    if draw(st.booleans()):
        schema["exclusiveMaximum" if draw(st.booleans()) else "maximum"] = low + width
    if draw(st.booleans()):
        schema["multipleOf"] = draw(st.sampled_from([0.5, 0.25, 0.1, 0.01]))
    return schema


@st.composite
def strings(draw: st.DrawFn) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    choice = draw(st.sampled_from(["plain", "pattern", "format"]))
    if choice == "pattern":
        schema["pattern"] = draw(st.sampled_from(PATTERNS))
    elif choice == "format":
        schema["format"] = draw(st.sampled_from(FORMATS))
    else:
        low = draw(st.integers(0, 40))
        schema["minLength"] = low
        if draw(st.booleans()):
            schema["maxLength"] = low + draw(st.integers(0, 10))
    return schema


LEAVES = st.one_of(
    strings(),
    integers(),
    numbers(),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.lists(st.one_of(NAMES, st.integers()), min_size=1, max_size=5, unique=True).map(
        lambda values: {"enum": values}
    ),
    NAMES.map(lambda value: {"const": value}),
    st.just({}),
)


def containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    @st.composite
    def objects(draw: st.DrawFn) -> dict[str, Any]:
        properties = draw(st.dictionaries(NAMES, children, min_size=0, max_size=4))
        required = [name for name in properties if draw(st.booleans())]
        schema: dict[str, Any] = {"type": "object", "properties": properties, "required": required}
        if draw(st.booleans()):
            schema["additionalProperties"] = False
        return schema

    @st.composite
    def arrays(draw: st.DrawFn) -> dict[str, Any]:
        low = draw(st.integers(0, 3))
        schema: dict[str, Any] = {"type": "array", "items": draw(children), "minItems": low}
        if draw(st.booleans()):
            schema["maxItems"] = low + draw(st.integers(0, 3))
        return schema

    return st.one_of(
        objects(),
        arrays(),
        st.lists(children, min_size=1, max_size=3).map(lambda branches: {"anyOf": branches}),
        st.sampled_from([["string", "null"], ["integer", "null"], ["number", "boolean"]]).map(
            lambda kinds: {"type": kinds}
        ),
    )


SCHEMAS = st.recursive(LEAVES, containers, max_leaves=12)

RECURSIVE = [
    {
        "type": "object",
        "properties": {
            "value": {"type": "integer"},
            "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]},
        },
        "required": ["value", "next"],
        "additionalProperties": False,
    },
    {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["name", "children"],
                "additionalProperties": False,
            }
        },
        "$ref": "#/$defs/node",
    },
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=SCHEMAS, seed=st.integers(0, 2**32))
def test_any_schema_of_the_subset_gets_a_valid_document(schema: Any, seed: int) -> None:
    text = document(check_schema(schema, strict=False), seed)
    jsonschema.validate(json.loads(text), schema)
    assert document(check_schema(schema, strict=False), seed) == text  # deterministic


@pytest.mark.parametrize("schema", RECURSIVE, ids=["linked list", "tree"])
def test_recursive_schemas_end(schema: Any) -> None:
    for seed in range(20):
        text = document(check_schema(schema, strict=False), seed)
        jsonschema.validate(json.loads(text), schema)


def deep(levels: int) -> Any:
    schema: Any = {}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


HOSTILE = st.one_of(
    st.integers(0, 80).map(deep),
    st.integers(10**4, 10**12).map(lambda n: {"type": "array", "minItems": n}),
    st.integers(10**5, 10**12).map(lambda n: {"type": "string", "minLength": n}),
    st.sampled_from(
        [
            "^(a+)+$",
            "(a|aa)+b",
            "((a*)*)*c",
            "(?:){1000000}" * 4,
            "a{99999999}",
            "(" * 500 + ")" * 500,
            r"\p{L}+",
        ]
    ).map(
        lambda p: {
            "type": "object",
            "properties": {"s": {"type": "string", "pattern": p}},
            "required": ["s"],
        }
    ),
    st.just({"type": "object", "properties": {"n": {"$ref": "#"}}, "required": ["n"]}),
    st.integers(2, 60).map(
        lambda n: {
            "$defs": {f"d{i}": {"$ref": f"#/$defs/d{(i + 1) % n}"} for i in range(n)},
            "$ref": "#/$defs/d0",
        }
    ),
    st.integers(2, 40).map(
        lambda n: {
            "type": "array",
            "minItems": n,
            "items": {"type": "array", "minItems": n, "items": {"type": "array", "minItems": n}},
        }
    ),
    st.integers(1, 12).map(
        lambda n: {
            "anyOf": [
                {
                    "anyOf": [{"$ref": "#"}] * n,
                    "type": "object",
                    "properties": {"x": {"$ref": "#"}},
                    "required": ["x"],
                }
            ]
        }
    ),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=HOSTILE, seed=st.integers(0, 2**32))
def test_a_hostile_schema_gets_a_refusal_or_a_bounded_document_quickly(
    schema: Any, seed: int
) -> None:
    started = time.process_time()
    try:
        text = document(check_schema(schema, strict=False), seed)
    except SchemaRefused as refused:
        assert refused.message("x")
    else:
        assert len(text) < 2 * MAX_CHARS
        jsonschema.validate(json.loads(text), schema)
    assert time.process_time() - started < 2.0


@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_pattern_string_matches_its_pattern(pattern: str) -> None:
    for seed in range(10):
        assert re.search(pattern, string_for(pattern, random.Random(seed)))


@pytest.mark.parametrize(
    "pattern",
    [
        "a{2000}",
        "(?:){1000000}",
        "(" * 200 + ")" * 200,
        "(" * 5000 + ")" * 5000,
        r"\p{L}",
        "[^\x00-\U0010ffff]",
    ],
)
def test_a_pattern_past_the_bounds_is_refused(pattern: str) -> None:
    with pytest.raises(PatternRefused):
        string_for(pattern, random.Random(0))


@pytest.mark.parametrize(
    ("schema", "context", "says"),
    [
        ({"type": "object", "properties": {"a": {}}}, (), "'additionalProperties' is required"),
        (
            {
                "type": "object",
                "properties": {
                    "a": {"type": "object", "properties": {}, "additionalProperties": False}
                },
                "additionalProperties": False,
                "required": [],
            },
            (),
            "Missing 'a'",
        ),
        ({"anyOf": [{"type": "object"}]}, (), "the root must be an object"),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "object"}},
                "required": ["a"],
                "additionalProperties": False,
            },
            ("properties", "a"),
            "'additionalProperties'",
        ),
    ],
)
def test_strict_schemas_follow_openais_rules(
    schema: Any, context: tuple[str, ...], says: str
) -> None:
    with pytest.raises(SchemaRefused) as refused:
        check_schema(schema, strict=True)
    assert refused.value.context == context and says in refused.value.what
    check_schema(schema, strict=False)  # the same schema is fine when not strict


def test_a_ref_index_of_other_digits_resolves_to_nothing() -> None:
    """``#/x/¹``: a digit to ``str.isdigit``, no list index: a refusal, not a ValueError."""
    schema = {"type": "object", "properties": {"a": {"$ref": "#/x/\u00b9"}}, "x": [{}]}
    with pytest.raises(SchemaRefused) as refused:
        check_schema(schema, strict=False)
    assert "does not resolve" in refused.value.what
