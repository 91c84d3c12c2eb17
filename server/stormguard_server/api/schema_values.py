"""A JSON document valid for a checked schema (``schema_check.py``): the content of a
structured-output answer, the arguments of a tool call.

No library fits at run time. jsf draws from the global ``random`` and Faker
(no per-request seed) and builds ``minItems`` items whatever their number;
hypothesis-jsonschema builds Hypothesis strategies, which are for tests (drawing
one value is slow and cannot be seeded per call); polyfactory starts from Python
types, not from a schema. So this is a small walk over the subset the checks
let through, from a ``random.Random`` seeded by the request: the same request
gets the same document. Every document is validated by the schema's own
validator before it is sent; one that fails is drawn again with the next seed,
``ATTEMPTS`` times, then the schema is refused (a 400), never answered wrongly.

Bounded: at most ``MAX_DEPTH`` levels of objects and arrays (recursion through
``$ref`` takes a branch that ends: ``null``, an empty array, a scalar), at most
``MAX_NODES`` values and ``MAX_CHARS`` characters of strings, at most
``MAX_STEPS`` subschemas visited per attempt. Past those the schema is refused.
Below ``_LEAN_DEPTH`` a document is fuller (optional properties, a few items),
deeper it takes the smallest choice each time, so recursive schemas end.
"""

from __future__ import annotations

import json
import math
import random
import uuid
from fractions import Fraction
from typing import Any, TypeGuard

from stormguard_server.api.regex_values import PatternRefused, string_for
from stormguard_server.api.schema_check import CheckedSchema, Context, SchemaRefused, resolve_ref
from stormguard_server.engine.tokenizer import OUTPUT_WORDS

ATTEMPTS = 4
MAX_DEPTH = 10
MAX_NODES = 10_000
MAX_CHARS = 262_144
MAX_STEPS = 50_000
_LEAN_DEPTH = 4
_MAX_REF_HOPS = 32
_SAFE_INT = 2**53


class _DeadEnd(Exception):
    """This branch gives no document within the bounds; another branch may."""


class _TooBig(Exception):
    """No branch can: the schema asks for more than the bounds allow."""

    def __init__(self, what: str, context: Context) -> None:
        super().__init__(what)
        self.what, self.context = what, context


def document(schema: CheckedSchema, seed: int) -> str:
    """The JSON text of a document ``schema`` accepts, the same for the same ``seed``;
    raises ``SchemaRefused`` when none is found within the bounds."""
    why = "no branch of it ends within the bounds"
    for attempt in range(ATTEMPTS):
        rng = random.Random(f"{seed}:{attempt}")
        walk = _Walk(schema.root, rng)
        try:
            value = walk.value(schema.root, depth=0, hops=0)
        except _DeadEnd as exc:
            why = str(exc) or why
            continue
        except _TooBig as exc:
            where = "/".join(exc.context)
            raise SchemaRefused(f"{exc.what} (at /{where} of the document)") from None
        except RecursionError:
            raise SchemaRefused("it nests too deeply to answer") from None
        except (ArithmeticError, ValueError) as exc:  # a bound past what floats hold
            raise SchemaRefused(f"its numbers are out of range ({exc})") from None
        error = schema.first_error(value)
        if error is None:
            return json.dumps(value, ensure_ascii=False, allow_nan=False)
        why = f"the document drawn was not valid: {error}"
    raise SchemaRefused(f"this server found no document the schema accepts ({why})")


class _Walk:
    def __init__(self, root: dict[str, Any], rng: random.Random) -> None:
        self.root = root
        self.rng = rng
        self.path: list[str] = []
        self.nodes = 0
        self.chars = 0
        self.steps = 0

    def too_big(self, what: str) -> _TooBig:
        return _TooBig(what, tuple(self.path))

    def value(self, schema: Any, *, depth: int, hops: int) -> Any:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise self.too_big(f"it takes over {MAX_STEPS} steps to answer")
        if schema is True:
            return self.text(schema={})
        if schema is False or not isinstance(schema, dict):
            raise _DeadEnd("a false schema accepts nothing")
        schema = self.merged(schema, hops)
        if "const" in schema:
            return schema["const"]
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return self.rng.choice(schema["enum"])
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list):
                return self.one_of(schema[key], depth=depth, hops=hops)
        kind = self.kind(schema, depth)
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise self.too_big(f"a document for it has over {MAX_NODES} values")
        if kind == "object":
            return self.object(schema, depth)
        if kind == "array":
            return self.array(schema, depth)
        if kind == "string":
            return self.text(schema)
        if kind == "integer":
            return self.integer(schema)
        if kind == "number":
            return self.number(schema)
        if kind == "boolean":
            return self.rng.random() < 0.5
        return None

    def merged(self, schema: dict[str, Any], hops: int) -> dict[str, Any]:
        """``$ref`` and a one-schema ``allOf`` replaced by what they name, the siblings
        kept over it (as openai-python inlines a ``$ref`` with a description)."""
        while "$ref" in schema or "allOf" in schema:
            hops += 1
            if hops > _MAX_REF_HOPS:
                raise _DeadEnd(f"over {_MAX_REF_HOPS} $ref in a row")
            rest = {k: v for k, v in schema.items() if k not in ("$ref", "allOf")}
            target = (
                resolve_ref(self.root, schema["$ref"]) if "$ref" in schema else schema["allOf"][0]
            )
            if not isinstance(target, dict):
                return rest if target is True else {"enum": []} if target is False else rest
            schema = {**target, **rest}
        return schema

    def one_of(self, branches: list[Any], *, depth: int, hops: int) -> Any:
        order = self.rng.sample(branches, len(branches))
        if depth >= _LEAN_DEPTH:  # deep: the branches that end first
            order.sort(key=_weight)
        why = "no branch of anyOf ends within the bounds"
        for branch in order:
            try:
                return self.value(branch, depth=depth, hops=hops)
            except _DeadEnd as exc:
                why = str(exc)
        raise _DeadEnd(why)

    def kind(self, schema: dict[str, Any], depth: int) -> str:
        declared = schema.get("type")
        if isinstance(declared, str):
            return declared
        if isinstance(declared, list) and declared:
            if depth >= _LEAN_DEPTH and "null" in declared:
                return "null"
            concrete = [kind for kind in declared if kind != "null"] or declared
            return str(self.rng.choice(concrete))
        if any(key in schema for key in ("properties", "required", "additionalProperties")):
            return "object"
        if any(key in schema for key in ("items", "prefixItems", "minItems", "maxItems")):
            return "array"
        if any(key in schema for key in ("minimum", "maximum", "multipleOf")):
            return "number"
        return "string"

    # -- containers -----------------------------------------------------------

    def object(self, schema: dict[str, Any], depth: int) -> dict[str, Any]:
        if depth >= MAX_DEPTH:
            raise _DeadEnd(f"it needs objects nested over {MAX_DEPTH} levels deep")
        properties = schema.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        required = [name for name in schema.get("required", []) if isinstance(name, str)]
        must = set(required)
        lean = depth >= _LEAN_DEPTH
        names = [name for name in properties if name in must or not lean]
        names += [name for name in required if name not in properties]
        extra = schema.get("additionalProperties", True)
        out: dict[str, Any] = {}
        for name in names:
            self.path.append(name)
            out[name] = self.value(properties.get(name, extra), depth=depth + 1, hops=0)
            self.path.pop()
        return out

    def array(self, schema: dict[str, Any], depth: int) -> list[Any]:
        if depth >= MAX_DEPTH:
            raise _DeadEnd(f"it needs arrays nested over {MAX_DEPTH} levels deep")
        low = _int_or(schema.get("minItems"), 0)
        high = _int_or(schema.get("maxItems"), low + 3)
        if low > MAX_NODES:
            raise self.too_big(f"'minItems' {low} is over {MAX_NODES} values")
        if low > high:
            raise _DeadEnd("minItems is over maxItems")
        count = low if depth >= _LEAN_DEPTH else min(high, max(low, self.rng.randint(1, 3)))
        prefix = schema.get("prefixItems")
        prefix = prefix if isinstance(prefix, list) else []
        items = schema.get("items", True)
        unique = schema.get("uniqueItems") is True
        out: list[Any] = []
        for index in range(count):
            self.path.append(str(index))
            item_schema = prefix[index] if index < len(prefix) else items
            for _ in range(8 if unique else 1):
                item = self.value(item_schema, depth=depth + 1, hops=0)
                if not unique or item not in out:
                    break
            self.path.pop()
            out.append(item)
        return out

    # -- scalars --------------------------------------------------------------

    def text(self, schema: dict[str, Any]) -> str:
        low = _int_or(schema.get("minLength"), 0)
        high = _int_or(schema.get("maxLength"), None)
        if low > MAX_CHARS:
            raise self.too_big(f"'minLength' {low} is over the {MAX_CHARS} characters allowed")
        pattern, fmt = schema.get("pattern"), schema.get("format")
        if isinstance(pattern, str):
            try:
                value = string_for(pattern, self.rng)
            except PatternRefused as exc:
                raise self.too_big(str(exc)) from None
        elif isinstance(fmt, str) and fmt in _FORMATS:
            value = _FORMATS[fmt](self.rng)
        else:
            words = [self.rng.choice(OUTPUT_WORDS) for _ in range(self.rng.randint(1, 3))]
            length = sum(map(len, words)) + len(words) - 1
            while length < low:
                words.append(self.rng.choice(OUTPUT_WORDS))
                length += len(words[-1]) + 1
            value = " ".join(words)
            if high is not None:
                value = value[:high]
        self.chars += len(value)
        if self.chars > MAX_CHARS:
            raise self.too_big(f"a document for it has over {MAX_CHARS} characters of strings")
        return value

    def integer(self, schema: dict[str, Any]) -> int:
        low, high = _bounds(schema)
        first = -_SAFE_INT if low is None else math.ceil(low)
        if low is not None and _excl(schema, "Minimum") and first == low:
            first += 1
        last = _SAFE_INT if high is None else math.floor(high)
        if high is not None and _excl(schema, "Maximum") and last == high:
            last -= 1
        first, last = _window(first, last, low is None, high is None)
        step = _fraction(schema.get("multipleOf")) or Fraction(1)
        # The integers among the multiples of p/q are the multiples of p.
        step = Fraction(step.numerator)
        k_first, k_last = math.ceil(first / step), math.floor(last / step)
        if k_first > k_last:
            raise _DeadEnd("no integer lies within its bounds")
        return int(self.rng.randint(k_first, min(k_last, k_first + 100)) * step)

    def number(self, schema: dict[str, Any]) -> int | float:
        low, high = _bounds(schema)
        step = _fraction(schema.get("multipleOf"))
        if step is None:
            first, last = _window(low, high, low is None, high is None)
            middle = (first + last) / 2
            for candidate in (round(self.rng.uniform(first, last), 2), middle, first, last):
                if math.isfinite(candidate) and _inside(candidate, schema):
                    return candidate
            raise _DeadEnd("no number lies within its bounds")
        first, last = _window(low, high, low is None, high is None)
        # In fractions: 1.7e308 / 1e-300 is no float.
        low_k, high_k = math.ceil(Fraction(first) / step), math.floor(Fraction(last) / step)
        multiples = range(low_k, high_k + 1)[:101]
        # A float is a multiple when value / multipleOf is a whole float: the test
        # Python's jsonschema and pydantic make (1.19 / 0.01 is 118.99999999999999).
        within = [
            k
            for k in multiples
            if _inside(float(k * step), schema) and (float(k * step) / float(step)).is_integer()
        ]
        if not within:
            raise _DeadEnd("no multiple of multipleOf lies within its bounds")
        value = self.rng.choice(within) * step
        return int(value) if value.denominator == 1 else float(value)


def _weight(branch: Any) -> int:
    """How far a branch is from ending: null first, then scalars, then the rest."""
    if not isinstance(branch, dict):
        return 1
    if branch.get("type") == "null":
        return 0
    if "$ref" in branch or branch.get("type") in ("object", "array") or "properties" in branch:
        return 2
    return 1


def _int_or(value: Any, default: Any) -> Any:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _fraction(value: Any) -> Fraction | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return None
    return Fraction(str(value)) if math.isfinite(value) else None


def _bounds(schema: dict[str, Any]) -> tuple[float | None, float | None]:
    """The tightest lower and upper bounds, inclusive or not (``_excl`` says which)."""
    low: list[float] = []
    high: list[float] = []
    for key, side in (("minimum", low), ("exclusiveMinimum", low)):
        if _number(value := schema.get(key)):
            side.append(value)
    for key, side in (("maximum", high), ("exclusiveMaximum", high)):
        if _number(value := schema.get(key)):
            side.append(value)
    return (max(low) if low else None), (min(high) if high else None)


def _excl(schema: dict[str, Any], side: str) -> bool:
    """Whether the bound ``_bounds`` took on that side is the exclusive one."""
    exclusive, inclusive = schema.get(f"exclusive{side}"), schema.get(side.lower())
    if not _number(exclusive):
        return False
    if not _number(inclusive):
        return True
    return bool(exclusive >= inclusive) if side == "Minimum" else bool(exclusive <= inclusive)


def _window(first: Any, last: Any, open_low: bool, open_high: bool) -> tuple[Any, Any]:
    """A bounded window of a range: 100 wide past its one bound; 0..100 with none."""
    if open_low and open_high:
        return 0, 100
    if open_low:
        return last - 100, last
    if open_high:
        return first, first + 100
    return first, last


def _inside(value: float, schema: dict[str, Any]) -> bool:
    low, high = schema.get("minimum"), schema.get("maximum")
    above, below = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    return (
        (not _number(low) or value >= low)
        and (not _number(high) or value <= high)
        and (not _number(above) or value > above)
        and (not _number(below) or value < below)
    )


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _word(rng: random.Random) -> str:
    return str(rng.choice(OUTPUT_WORDS))


def _date(r: random.Random) -> str:
    return f"2025-0{r.randint(1, 9)}-{r.randint(10, 28)}"


def _time(r: random.Random) -> str:
    return f"{r.randint(10, 23)}:{r.randint(10, 59)}:00Z"


# The formats JSON Schema 2020-12 defines (OpenAI's nine among them); any other is
# an annotation, as the validator reads it.
_FORMATS: dict[str, Any] = {
    "date-time": lambda r: f"{_date(r)}T{_time(r)}",
    "date": _date,
    "time": _time,
    "duration": lambda r: f"P{r.randint(1, 9)}DT{r.randint(1, 23)}H",
    "email": lambda r: f"{_word(r)}@example.com",
    "idn-email": lambda r: f"{_word(r)}@example.com",
    "hostname": lambda r: f"{_word(r)}.example.com",
    "idn-hostname": lambda r: f"{_word(r)}.example.com",
    "ipv4": lambda r: f"192.0.2.{r.randint(1, 254)}",
    "ipv6": lambda r: f"2001:db8::{r.randint(1, 65535):x}",
    "uuid": lambda r: str(uuid.UUID(int=r.getrandbits(128), version=4)),
    "uri": lambda r: f"https://example.com/{_word(r)}",
    "iri": lambda r: f"https://example.com/{_word(r)}",
    "uri-reference": lambda r: f"/{_word(r)}",
    "iri-reference": lambda r: f"/{_word(r)}",
    "uri-template": lambda r: f"https://example.com/{{{_word(r)}}}",
    "json-pointer": lambda r: f"/{_word(r)}",
    "relative-json-pointer": lambda r: f"{r.randint(0, 3)}/{_word(r)}",
    "regex": lambda r: f"^{_word(r)}$",
}
