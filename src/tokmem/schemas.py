"""JSON schemas from users, checked before any grammar is compiled from them: bounded, of the features the grammar
backend enforces, and self-contained.

A schema may come from a bank's metadata, a training catalog or a request, so it is bad input until checked:
``check_schema`` refuses (``SchemaError``, naming the field and the keyword) what xgrammar 0.2.8 would not enforce
(it silently ignores ``not``, ``if``/``then``/``else``, ``uniqueItems``, ``contains``, ``dependentRequired``, …;
``allOf`` of several schemas and an unknown ``format`` become "any value"), what it cannot compile (a reference that
points nowhere, a regex repetition over 128), and what costs too much (a schema over ``Budget.max_chars`` characters
or nested deeper than ``Budget.max_depth``).  What it keeps is the schema with every local reference (``"#"``,
``"#/$defs/…"``, ``"#/definitions/…"``, any JSON pointer into the schema) re-pointed into one root ``$defs`` of the
referenced parts, so the schema stays valid when it is nested in another (``decoding_schema``) and a
recursive model (pydantic's) needs no expansion.  Annotations (``title``, ``description``, ``default``, …) are
dropped: they bind nothing.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from urllib.parse import unquote

from tokmem.errors import DataError, listed

# keywords whose value is one schema, a list of schemas, or a map of names to schemas
ONE = {"items", "additionalProperties", "unevaluatedProperties", "unevaluatedItems", "propertyNames"}
MANY = {"anyOf", "oneOf", "allOf", "prefixItems"}
NAMED = {"properties", "patternProperties"}
DEFINITIONS = {"$defs", "definitions"}  # reached through references only
ANNOTATIONS = {
    "title",
    "description",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$comment",
    "$schema",
    "$id",
    "discriminator",
    "contentEncoding",
    "contentMediaType",
}
TYPES = {"string", "number", "integer", "boolean", "null", "array", "object"}
FORMATS = {"email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname", "uuid", "uri"}
COUNTS = {"minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"}
BOUNDS = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
REPEAT = re.compile(r"(?<!\\)\{(\d+)(?:,(\d*))?\}")  # a regex quantifier {n}, {n,} or {n,m}
# "$var2.coordinates.latitude$", "$var1.data[0].id$": bounded, so that a reference always closes
REFERENCE = {"type": "string", "pattern": r"^\$var[0-9]{1,3}(\.[A-Za-z_][A-Za-z0-9_]{0,31}|\[[0-9]{1,4}\]){0,4}\$$"}
# What an array without ``items`` may hold.  xgrammar 0.2.8's own "any value" rule, with compact separators, accepts
# one element only and objects of one key only; spelled out like this it accepts the data's lists of objects.
ANY_ITEM = {
    "anyOf": [
        {"type": "object", "additionalProperties": True},
        {"type": "string"},
        {"type": "number"},
        {"type": "boolean"},
    ]
}


# Bounds on a value whose schema sets none, so that a call always closes (a runaway string — an SQL statement, a
# 150-digit id — would otherwise run to max_new_tokens and leave the JSON open).  Training stores a string bound
# learned from the training values in the bank's schema (``learned_schema``); 128 characters, the default, hold the
# longest free-text value of ComplexFuncBench's queries (83); a tool that needs longer ones says so with ``maxLength``.
STRING_BOUND = 128
INTEGER_BOUND = 10**15  # |an integer argument|: at most 16 digits
# the least bound learned from training values (``learned_schema``): a city seen as "Oslo" may be longer
LEARNED_FLOOR = 32
# A bank's schema trained with ``key_order="given"`` lists the key orders its calls wrote (``learned_schema``); the
# grammar takes any of them.  (xgrammar's own ``any_order`` would also let a required key be left out or a key be
# written twice.)
KEY_ORDERS = "x-tokmem-key-orders"
MOST_KEY_ORDERS = 16  # the orders kept, most frequent first: each is an alternative of the tool's grammar
# A bank's schema keeps out the optional arguments no training call gave (``learned_schema``): a memory token never
# learned to write them, and offered them it writes garbage (ComplexFuncBench's ``price_min: 1000000000000000``).
# They are kept under this key, name → schema, so that a client's schema may still name them
# (``tool_rules.tool_schemas``).
UNTRAINED = "x-tokmem-untrained"


class SchemaError(DataError):
    """A JSON schema that schema-bound decoding cannot take (its field and keyword named): the sender's to fix."""


@dataclass(frozen=True)
class Budget:
    """What one schema may cost: its compile time, size and nesting, and its patterns' repetition counts."""

    # compiling it (off the decoding thread); a slower compile is refused.  None: no limit, as offline, where the
    # schemas are a bank's own and must compile however long the tokenizer makes it take (Qwen's 151k tokens take
    # seconds on a loaded CPU); the server sets one (serve.config), so one client's schema cannot hold the others up
    seconds: float | None = None
    max_chars: int = 65_536  # its compact JSON text
    max_depth: int = 32  # schemas nested in schemas
    max_repeat: int = 128  # the largest {n,m} in a pattern (xgrammar 0.2.8 fails to compile larger ones)


def check_schema(schema, where: str = "schema", budget: Budget = Budget()) -> dict | bool:
    """``schema`` checked against ``budget`` and the backend's features, every reference resolved into one root
    ``$defs`` (see the module's docstring); a ``SchemaError`` names what is wrong, under ``where``."""
    try:
        size = len(json.dumps(schema, separators=(",", ":")))
    except (TypeError, ValueError, RecursionError):
        raise SchemaError(f"{where}: not a JSON schema (not JSON, or nested too deep)") from None
    if size > budget.max_chars:
        raise SchemaError(f"{where}: the schema has {size} characters; the limit is {budget.max_chars}")
    return _Checker(schema, where, budget).run()


class _Checker:
    """One walk over a schema and the parts its references reach.  ``names``: each pointer referenced → its name in
    the root ``$defs``, ``queue``: the pointers in the order they were first met, ``defs``: name → checked part."""

    def __init__(self, root, where: str, budget: Budget):
        self.root, self.where, self.budget = root, where, budget
        self.names: dict[str, str] = {}
        self.queue: list[str] = []
        self.defs: dict[str, dict | bool] = {}

    def run(self) -> dict | bool:
        checked = self.walk(self.root, self.where, 0)
        for pointer in self.queue:  # grows as the referenced parts reference more
            self.defs[self.names[pointer]] = self.walk(self.target(pointer), f"{self.where}.$ref {pointer!r:.80}", 0)
        self.refuse_bare_cycles()
        if not self.defs:
            return checked
        if not isinstance(checked, dict):
            raise SchemaError(f"{self.where}: a boolean schema has no references")
        return {**checked, "$defs": self.defs}

    def refuse_bare_cycles(self) -> None:
        """A part that is only a reference to itself, directly or through others, admits no value: refused."""
        for name in self.defs:
            seen, at = [], name
            while isinstance(self.defs[at], dict) and list(self.defs[at]) == ["$ref"] and at not in seen:
                seen.append(at)
                at = self.defs[at]["$ref"].rsplit("/", 1)[1]
            if at in seen:
                pointers = [p for p, n in self.names.items() if n in seen]
                raise SchemaError(
                    f"{self.where}: the references {listed(pointers)} only point at each other (no value)"
                )

    def walk(self, schema, where: str, depth: int) -> dict | bool:
        """``schema`` with its subschemas checked, its references re-pointed and its annotations dropped."""
        if isinstance(schema, bool):
            return schema
        if not isinstance(schema, dict):
            raise SchemaError(f"{where}: a schema must be a JSON object or a boolean, not {_kind(schema)}")
        if depth > self.budget.max_depth:
            raise SchemaError(f"{where}: schemas nest deeper than the limit of {self.budget.max_depth}")
        checked = {}
        for key, value in schema.items():
            at = f"{where}.{key}"
            if key == "items" and isinstance(value, list):
                raise SchemaError(f"{at}: a list of schemas is not supported (use 'prefixItems')")
            if key in ONE:
                checked[key] = self.walk(value, at, depth + 1)
            elif key in MANY:
                checked[key] = [self.walk(s, f"{at}[{i}]", depth + 1) for i, s in enumerate(_list(value, at, key))]
            elif key in NAMED:
                checked[key] = {n: self.walk(s, f"{at}.{n}", depth + 1) for n, s in _object(value, at).items()}
            elif key == "$ref":
                checked[key] = self.reference(value, at)
            elif key not in DEFINITIONS and key not in ANNOTATIONS:
                checked[key] = _value(key, value, at, schema, self.budget)
        if len(checked.get("allOf", [])) > 1:
            raise SchemaError(f"{where}.allOf: more than one schema is not supported (merge them into one)")
        return checked

    def reference(self, pointer, at: str) -> str:
        if not isinstance(pointer, str) or not (pointer == "#" or pointer.startswith("#/")):
            raise SchemaError(
                f"{at}: only references within the schema ('#' or '#/…') are supported, not {pointer!r:.80}"
            )
        if pointer not in self.names:
            self.target(pointer, at)
            self.names[pointer] = f"ref{len(self.names)}"
            self.queue.append(pointer)
        return f"#/$defs/{self.names[pointer]}"

    def target(self, pointer: str, at: str | None = None):
        """The part of the root schema a JSON pointer names."""
        node = self.root
        for part in pointer[2:].split("/") if pointer != "#" else []:
            part = unquote(part).replace("~1", "/").replace("~0", "~")
            if isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            elif isinstance(node, dict) and part in node:
                node = node[part]
            else:
                raise SchemaError(f"{at or self.where}: the reference {pointer!r:.80} points at nothing in the schema")
        return node


def decoding_schema(parameters: dict, references: bool = True, where: str = "parameters", budget: Budget = Budget()):
    """The schema a tool's arguments decode under: ``parameters``' properties and required keys (of the model a root
    ``$ref`` names, as pydantic writes a recursive one; the rest of its root binds nothing: arguments are an object),
    checked (``check_schema``, references resolved), with no extra keys, and with ``references`` each argument also
    accepting a reference to an earlier result (``REFERENCE``).  An array argument without ``items`` gets
    ``ANY_ITEM``; strings and integers are ``bounded``.  With ``KEY_ORDERS`` (a bank's schema trained with
    ``key_order="given"``): any of those orders, each an object of its own (``anyOf``)."""
    orders = key_orders(parameters, where)
    if len(orders) > 1:
        one = {key: value for key, value in parameters.items() if key != KEY_ORDERS}
        alternatives = [
            decoding_schema({**one, "properties": {k: one["properties"][k] for k in keys}}, references, where, budget)
            for keys in orders
        ]
        defs = {name: spec for alternative in alternatives for name, spec in alternative.pop("$defs", {}).items()}
        # xgrammar 0.2.8 builds one rule for objects alike but for their keys' order (the first one's order for
        # all); a bound each alternative's keys never reach (no extra keys are allowed) keeps them apart
        for k, alternative in enumerate(alternatives):
            alternative["maxProperties"] = len(alternative["properties"]) + k
        return {"anyOf": alternatives, **({"$defs": defs} if defs else {})}
    root = {key: parameters[key] for key in ("properties", "required", "$ref", *DEFINITIONS) if key in parameters}
    checked = check_schema({"type": "object", **root}, where, budget)
    defs = checked.get("$defs", {})
    body = defs[checked["$ref"].rsplit("/", 1)[1]] if "$ref" in checked else checked
    if not isinstance(body, dict):
        raise SchemaError(f"{where}.$ref: must name an object schema")
    properties = {
        name: {"anyOf": [_with_items(spec), REFERENCE]} if references else _with_items(spec)
        for name, spec in body.get("properties", {}).items()
    }
    schema = {"type": "object", "properties": properties, "required": body.get("required", [])}
    return bounded({**schema, "additionalProperties": False, **({"$defs": defs} if defs else {})})


def _with_items(spec):
    return (
        {**spec, "items": ANY_ITEM}
        if isinstance(spec, dict) and spec.get("type") == "array" and "items" not in spec
        else spec
    )


def _value(key: str, value, at: str, schema: dict, budget: Budget):
    """A keyword's value that is not a schema, checked (the backend takes some wrong types as a crash)."""
    if key in ("enum", "const"):
        if key == "enum" and not isinstance(value, list):
            raise SchemaError(f"{at}: must be a list of values")
    elif key == "type":
        types = value if isinstance(value, list) else [value]
        if not types or not all(isinstance(t, str) and t in TYPES for t in types):
            raise SchemaError(f"{at}: must be one of {', '.join(sorted(TYPES))}, or a list of them")
    elif key == "required":
        if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
            raise SchemaError(f"{at}: must be a list of property names")
    elif key == "format":
        if not isinstance(value, str) or value not in FORMATS:
            raise SchemaError(f"{at}: {value!r:.80} is not a supported format ({', '.join(sorted(FORMATS))})")
    elif key == "pattern":
        _pattern(value, at, budget)
    elif key in COUNTS:
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**31:
            raise SchemaError(f"{at}: must be a whole number from 0")
    elif key in BOUNDS or key == "multipleOf":
        if not isinstance(value, int | float) or isinstance(value, bool) or abs(value) > 1e300:
            raise SchemaError(f"{at}: must be a number")
        if key == "multipleOf" and schema.get("type") != "integer":
            raise SchemaError(f"{at}: is supported for type 'integer' only")
    else:
        raise SchemaError(f"{at}: the keyword {key!r:.80} is not supported by schema-bound decoding")
    return value


def _pattern(value, at: str, budget: Budget) -> None:
    if not isinstance(value, str):
        raise SchemaError(f"{at}: must be a regular expression (a string)")
    for match in REPEAT.finditer(value):
        largest = max(int(n) for n in match.groups() if n)
        if largest > budget.max_repeat:
            raise SchemaError(
                f"{at}: the repetition {match.group(0)[:40]} is over the limit of {budget.max_repeat} "
                "(use maxLength/minLength for long strings)"
            )


def _list(value, at: str, key: str) -> list:
    if not isinstance(value, list) or (key != "prefixItems" and not value):
        raise SchemaError(f"{at}: must be a non-empty list of schemas")
    return value


def _object(value, at: str) -> dict:
    if not isinstance(value, dict):
        raise SchemaError(f"{at}: must be an object of schemas")
    return value


def _kind(value) -> str:
    return {list: "a list", str: "a string", type(None): "null"}.get(type(value), type(value).__name__)


def bounded(schema):
    """``schema`` (a copy) with every string and integer that sets no bound of its own bounded, so that a call always
    closes: strings to ``STRING_BOUND`` characters (or the schema's ``maxLength``), integers to ±``INTEGER_BOUND``
    (``minimum``/``maximum``); a string with a ``pattern``, ``format``, ``enum`` or ``const`` is left as it is.

    A string's bound is a ``pattern`` of plain characters: xgrammar 0.2.8's own ``maxLength`` rule lets raw control
    characters (invalid JSON) through, and neither writes escapes, so a bounded string holds no quote, backslash or
    newline: the price of a call that always closes.  A bound over ``Budget.max_repeat`` (a pattern's longest
    repetition) stays a ``maxLength``: such a pattern compiles slowly.
    Non-integer numbers get no range here (xgrammar 0.2.8 writes a number with a range with at most 6 decimals, which
    would cut the coordinates a call copies from a result): ``grammar.numbers_bounded`` bounds their digits."""
    if isinstance(schema, list):
        return [bounded(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _bounded_under(key, value) for key, value in schema.items()}
    if out.get("type") == "string" and not _SHAPED & out.keys():
        low = out.get("minLength", 0)
        high = out.get("maxLength", max(STRING_BOUND, low))
        if high <= Budget.max_repeat:
            out = {key: value for key, value in out.items() if key not in ("minLength", "maxLength")}
            out["pattern"] = _PLAIN % (low, high)
        else:
            out["maxLength"] = high
    if out.get("type") == "integer" and not _INTEGER_BOUNDS & out.keys():
        out.update(minimum=-INTEGER_BOUND, maximum=INTEGER_BOUND)
    return out


def shared_leaves(schema: dict) -> dict:
    """``schema`` with every string or integer leaf that occurs more than once (the same constraints, annotations
    aside) replaced by a ``$ref`` to one definition of it: the same language, compiled once.  xgrammar builds the
    token masks of each rule it meets: a bounded string (``bounded``: a 128-character repetition) written out in every
    argument compiles far slower than once, shared."""
    counts: dict[str, int] = {}
    _leaves(schema, lambda key, leaf: counts.__setitem__(key, counts.get(key, 0) + 1))
    shared = {key: f"{_SHARED}{n}" for n, key in enumerate(k for k, c in counts.items() if c > 1)}
    if not shared:
        return schema
    defs = {name: json.loads(key) for key, name in shared.items()}

    def replace(node):
        if isinstance(node, list):
            return [replace(item) for item in node]
        if not isinstance(node, dict):
            return node
        key = _leaf_key(node)
        if key in shared:
            return {"$ref": f"#/$defs/{shared[key]}"}
        return {k: v if k in _UNTOUCHED else replace(v) for k, v in node.items()}

    out = replace(schema)
    return {**out, "$defs": {**out.get("$defs", {}), **defs}}


def _leaf_key(node) -> str | None:
    """A string or integer leaf's constraints as a key (annotations dropped), None for any other node."""
    if not isinstance(node, dict) or node.get("type") not in ("string", "integer") or not node.keys() <= _LEAF_KEYS:
        return None
    return json.dumps({k: v for k, v in node.items() if k not in _ANNOTATIONS}, sort_keys=True)


def _leaves(node, visit) -> None:
    if isinstance(node, list):
        for item in node:
            _leaves(item, visit)
    elif isinstance(node, dict):
        key = _leaf_key(node)
        if key is not None:
            visit(key, node)
            return
        for k, v in node.items():
            if k not in _UNTOUCHED:
                _leaves(v, visit)


def learned_schema(schema: dict | None, tool: str, examples, key_order: str = "calls") -> dict | None:
    """``schema`` (a copy) fitted to the calls of ``tool`` in the training ``examples``: without the optional
    arguments none of them gave (moved to ``UNTRAINED``), bounds on its strings (``_learned_bounds``) and its
    properties in the calls' order (``_learned_order``), or with ``key_order="schema"`` in the schema's own (the order
    a bank's arguments are then trained and decoded in), or with ``key_order="given"`` the calls' order and
    ``KEY_ORDERS``, the orders the calls write (``_given_orders``).  A tool no example calls keeps its schema."""
    if schema is None or not isinstance(schema.get("properties"), dict):
        return schema
    calls = [
        json.loads(s.call_arguments) for e in examples for s in e.steps if s.procedure == tool and s.call_arguments
    ]
    if not calls:
        return schema
    bounded = _learned_bounds(_given_keys(schema, calls), calls)
    if key_order == "schema":
        return bounded
    ordered = _learned_order(bounded, calls)
    return _given_orders(ordered, calls) if key_order == "given" else ordered


def _given_keys(schema: dict, calls: list[dict]) -> dict:
    """``schema`` without the optional properties no call gives, those kept under ``UNTRAINED``."""
    given, required = {key for call in calls for key in call}, set(schema.get("required") or ())
    untrained = {name: spec for name, spec in schema["properties"].items() if name not in given | required}
    if not untrained:
        return schema
    properties = {name: spec for name, spec in schema["properties"].items() if name not in untrained}
    return {**schema, "properties": properties, UNTRAINED: {**schema.get(UNTRAINED, {}), **untrained}}


def _given_orders(schema: dict, calls: list[dict]) -> dict:
    """``schema`` with ``KEY_ORDERS``: the key orders its calls write, most frequent first (at most
    ``MOST_KEY_ORDERS``), each followed by the keys it lacks in the schema's order; a call in an order of none of
    them is laid out in the schema's order.  ComplexFuncBench's calls of one tool write their keys in one order per
    query template (``Search_Hotels``: ``search_type, dest_id, …, adults, children_age`` or ``dest_id, search_type,
    …, adults, room_qty, sort_by``): trained on each order and free to take any, a memory token may commit to a
    template with its first key, as a fine-tuned model does (it picks the optional keys no better: docs/tools.md,
    "Schema-bound arguments")."""
    names = list(schema["properties"])
    written = [[key for key in call if key in schema["properties"]] for call in calls]
    orders = Counter(tuple([*order, *(name for name in names if name not in order)]) for order in written)
    kept = [list(order) for order, _ in orders.most_common(MOST_KEY_ORDERS)]
    return {**schema, KEY_ORDERS: kept} if len(kept) > 1 else schema


def key_orders(parameters: dict, where: str = "parameters") -> list[list[str]]:
    """The key orders a tool's arguments may be written in: its ``KEY_ORDERS`` (each checked to be an order of all its
    properties), else its properties' one order."""
    names = list(parameters.get("properties") or {})
    orders = parameters.get(KEY_ORDERS)
    if orders is None:
        return [names]
    if not isinstance(orders, list) or not all(
        isinstance(o, list) and all(isinstance(k, str) for k in o) and sorted(o) == sorted(names) for o in orders
    ):
        raise SchemaError(f"{where}.{KEY_ORDERS}: must be a list of orders, each of all the properties' names")
    return orders


def is_written_in(arguments: dict, keys: list[str]) -> bool:
    """Whether ``arguments``' keys come in the order of ``keys`` (each of them one of ``keys``, some left out)."""
    place = {key: k for k, key in enumerate(keys)}
    places = [place.get(key, -1) for key in arguments]
    return -1 not in places and places == sorted(places)


def _learned_bounds(schema: dict, calls: list[dict]) -> dict:
    """A ``maxLength`` on each string argument that sets no bound: twice the longest value the calls gave it, at least
    ``LEARNED_FLOOR`` characters.  An argument no call gave a value to (only references, or nothing) keeps the default
    bound (``bounded``)."""
    properties = dict(schema["properties"])
    for name, spec in properties.items():
        given = [len(c[name]) for c in calls if isinstance(c.get(name), str) and not _REFERENCE.fullmatch(c[name])]
        if (
            given
            and isinstance(spec, dict)
            and spec.get("type") == "string"
            and not (_SHAPED | {"maxLength"}) & spec.keys()
        ):
            properties[name] = {**spec, "maxLength": max(LEARNED_FLOOR, 2 * max(given), spec.get("minLength", 0))}
    return {**schema, "properties": properties}


def _learned_order(schema: dict, calls: list[dict]) -> dict:
    """The properties in the order the calls write them: by their mean place in the calls that give them (ties and the
    properties no call gives keep the schema's order, the latter last).  The grammar writes an object's keys in its
    schema's order, so a schema that lists them otherwise (ComplexFuncBench's ``Search_Car_Rentals`` puts the drop-off
    time second) would make a memory token write its arguments in an order it never trained on."""
    places: dict[str, list[int]] = {}
    for call in calls:
        for place, name in enumerate(call):
            places.setdefault(name, []).append(place)
    properties = schema["properties"]
    mean = {name: sum(places[name]) / len(places[name]) for name in properties if name in places}
    order = sorted(properties, key=lambda name: (name not in mean, mean.get(name, 0)))
    return {**schema, "properties": {name: properties[name] for name in order}}


def _bounded_under(key: str, value):
    if key in _UNTOUCHED:
        return value
    if key in _SCHEMA_MAPS and isinstance(value, dict):
        return {name: bounded(spec) for name, spec in value.items()}
    return bounded(value)


_PLAIN = r'^[^"\\\x00-\x1f]{%d,%d}$'  # %d to %d characters, none of which JSON escapes
# JSON values, not schemas (and a bound under ``not`` would invert)
_UNTOUCHED = {"enum", "const", "default", "examples", "not"}
_SCHEMA_MAPS = {"properties", "$defs", "definitions"}  # name → schema
# a string of one of these shapes is bounded by it (or not ours to bound)
_SHAPED = {"pattern", "format", "enum", "const"}
_REFERENCE = re.compile(REFERENCE["pattern"])
_ANNOTATIONS = {"description", "title", "examples", "default"}
_LEAF_KEYS = {"type", "pattern", "minLength", "maxLength", "minimum", "maximum", "format", *_ANNOTATIONS}
_SHARED = "tokmem_leaf_"  # the definitions shared_leaves adds (a name a schema of ours would not use)
_INTEGER_BOUNDS = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "enum", "const"}
