"""What the loaders of real tool-calling files (xLAM, NESTFUL, BFCL) share.

Each loader reads records (a JSON list or JSON lines, gzip-compressed when the name ends in .gz),
refuses a malformed one with a DataError naming the file, the record and the field, and turns each
usable record into an ``Example`` with one step per call: the tool is the procedure and the response
is the call as ``call_json`` writes it.  What it gives back is an ``Imported``: the examples, the
called tools' schemas (the catalog) and, per reason, how much it left out.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tokmem.data.procedures import Example, Step, call_json
from tokmem.io import read_text
from tokmem.errors import DataError

SCHEMA_CONFLICT = "records defining a called tool differently from the catalog (which keeps the first definition)"


@dataclass
class Imported:
    """Examples (one step per call), the catalog ``{name: {"name", "description", "parameters"}}`` of the tools
    they call, the number of records read, and ``skipped``: reason → how many were left out for it."""

    records: int = 0
    examples: list[Example] = field(default_factory=list)
    catalog: dict[str, dict] = field(default_factory=dict)
    skipped: Counter = field(default_factory=Counter)

    def offer(
        self,
        query: str | None,
        calls: list[tuple[str, dict]],
        id: str,
        schemas: dict[str, dict],
        unit: str = "records",
        results: list[str | None] | None = None,
        answer: str | None = None,
    ) -> None:
        """Keep the example these calls make, or count (as ``unit``) why there is none: no query, no calls, or a
        call to a tool ``schemas`` (name → catalog entry) does not define.  ``results``: each call's result text
        (None where unknown); ``answer``: the final answer in words after the last result."""
        if query is None:
            self.skipped[f"{unit} with no user message"] += 1
        elif not calls:
            self.skipped[f"{unit} with no calls"] += 1
        elif any(name not in schemas for name, _ in calls):
            self.skipped[f"{unit} calling a tool with no schema"] += 1
        else:
            self.examples.append(calls_example(query, calls, id, results, answer))
            differing = [name for name, _ in calls if self.catalog.setdefault(name, schemas[name]) != schemas[name]]
            if differing:
                self.skipped[SCHEMA_CONFLICT] += 1

    def calls_per_example(self) -> dict[int, int]:
        """Number of calls → number of examples with that many."""
        return dict(sorted(Counter(len(e.steps) for e in self.examples).items()))

    def require_examples(self, path) -> None:
        if not self.examples:
            reasons = (
                "; ".join(f"{reason}: {count}" for reason, count in self.skipped.items()) or "the file has no records"
            )
            raise DataError(f"{path}: no usable records ({reasons})")


def catalog_entry(name: str, description, parameters) -> dict:
    return {"name": name, "description": description or "", "parameters": parameters}


def calls_example(
    query: str, calls, id: str, results: list[str | None] | None = None, answer: str | None = None
) -> Example:
    """One step per ``(tool name, arguments)`` call, in order, each with its result text where ``results`` has one;
    ``answer``: the final answer after the last result."""
    results = results or [None] * len(calls)
    return Example(
        query,
        tuple(Step(name, call_json(name, arguments), result) for (name, arguments), result in zip(calls, results)),
        id=id,
        answer=answer,
    )


def result_text(value) -> str | None:
    """A tool's result as the text a sequence carries: a string as it is, anything else as compact JSON."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# ---- reading and validation ----------------------------------------------------------------------------


def read_records(path: Path) -> list:
    """The records of a JSON list file or a JSON lines file (either may be gzip-compressed)."""
    text = read_text(path)
    if text.lstrip().startswith("["):
        records = decode(text, path)
        if not isinstance(records, list):
            raise DataError(f"{path}: expected a JSON list of records")
        return records
    return [decode(line, path, f"line {number}") for number, line in enumerate(text.splitlines(), 1) if line.strip()]


def decode(text: str, path: Path, where: str = ""):
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        location = f"{where}, " if where else ""
        problem = f"{location}{err.msg} at line {err.lineno}, column {err.colno}"
        raise DataError(f"{path}: invalid JSON ({problem})") from None


def bad(where: str, field: str, problem: str) -> DataError:
    """``where`` is "FILE: record N"."""
    return DataError(f"{where}, field '{field}': {problem}")


def require_object(raw, where: str) -> dict:
    if not isinstance(raw, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    return raw


def text_field(raw: dict, name: str, where: str) -> str:
    """A required non-empty string field."""
    value = raw.get(name)
    if not isinstance(value, str) or not value.strip():
        raise bad(where, name, "missing or empty (must be a non-empty string)")
    return value


def list_field(raw: dict, name: str, where: str) -> list:
    value = raw.get(name)
    if not isinstance(value, list):
        raise bad(where, name, "missing or not a list")
    return value


def call_fields(call, where: str, field: str) -> tuple[str, dict]:
    """The (name, arguments) of a ``{"name", "arguments"}`` call object at ``field``."""
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"].strip():
        raise bad(where, field, "expected an object with a non-empty 'name' and 'arguments'")
    if not isinstance(call.get("arguments"), dict):
        raise bad(where, f"{field}.arguments", "missing or not an object")
    return call["name"], call["arguments"]


def tool_entry(tool, where: str, field: str = "") -> tuple[str, dict]:
    """(name, catalog entry) of a tool object ``{"name", "description", "parameters" | "query_parameters"}``;
    ``field`` is where the tool sits in its record, "" when the record is the tool (a spec file)."""
    if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or not tool["name"].strip():
        raise bad(where, field or "name", "expected a tool object with a non-empty 'name'")
    key = "parameters" if "parameters" in tool else "query_parameters"
    parameters = json_schema(tool.get(key, {}), where, f"{field}.{key}" if field else key)
    return tool["name"], catalog_entry(tool["name"], tool.get("description"), parameters)


def json_schema(parameters, where: str, field: str) -> dict:
    """A JSON schema as given, or one built from NESTFUL's flat ``{param: {"type", "required": bool, …}}``."""
    if not isinstance(parameters, dict):
        raise bad(where, field, "not an object")
    if "properties" in parameters:
        if not isinstance(parameters["properties"], dict):
            raise bad(where, f"{field}.properties", "not an object")
        return parameters
    properties, required = {}, []
    for name, spec in parameters.items():
        if not isinstance(spec, dict):
            raise bad(where, f"{field}.{name}", "not an object")
        properties[name] = {key: value for key, value in spec.items() if key != "required" and value not in ([], None)}
        if spec.get("required") is True:
            required.append(name)
    return {"type": "object", "properties": properties, "required": required}
