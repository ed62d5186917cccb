"""NESTFUL files (IBM): queries answered by sequences of API calls, later calls using earlier results.

A data file is a JSON list (or JSON lines) of records::

    {"input": "query", "output": [{"name": "Search_Hotels", "arguments": {...}, "label": "var1"}, ...], ...}

An argument may take an earlier call's result, written ``"$var1.path.to.field$"``.  A call's recorded result
(``"response"``, as ComplexFuncBench's records carry the real API responses) becomes its step's ``result``; with
results, a reference is resolved to the value in the recorded response it names (``resolve_references``:
ComplexFuncBench's convention: the model, seeing the results, writes and is scored on the value); without results
it stays that string (the model learns to write the reference).  The tools' schemas come with each record (``"tools": [...]``)
or from a spec file: a JSON list of ``{"name", "description", "query_parameters" | "parameters", …}``.
IBM ships the two side by side as ``X-data.json`` and ``X-spec.json``, so the spec defaults to that
neighbour.  A spec's flat ``{param: {"type", "description", "required": bool, …}}`` becomes a JSON
schema (``{"type": "object", "properties", "required"}``, empty ``enum`` / null ``default`` left out).

Some NESTFUL files end each answer with ``{"name": "var_result", "arguments": {...}}``: the final
answer (which results to return), not a tool call.  It is left out of the steps and counted.
"""

from __future__ import annotations

import re
from pathlib import Path

from tokmem.data.toolfiles import (
    Imported,
    bad,
    call_fields,
    list_field,
    read_records,
    require_object,
    result_text,
    text_field,
    tool_entry,
)
from tokmem.errors import DataError

ANSWER_STEP = "var_result"
REFERENCE = re.compile(r"\$(var\d+)((?:\.[^.$]+)*)\$")  # "$var1.coordinates.latitude$": a label, then a path
SKIP_ANSWER = "var_result steps (NESTFUL's final answer, not a tool call)"


def default_spec(path) -> Path | None:
    """The spec file IBM ships beside ``X-data.json[.gz]``: ``X-spec.json[.gz]``, when it exists."""
    path = Path(path)
    stem, found, suffix = path.name.rpartition("-data")
    spec = path.with_name(f"{stem}-spec{suffix}")
    return spec if found and spec.is_file() else None


def load_spec(path) -> dict[str, dict]:
    """Tool name → catalog entry, from a spec file (a JSON list of tool objects)."""
    path = Path(path)
    return dict(tool_entry(tool, f"{path}: record {k}") for k, tool in enumerate(read_records(path)))


def import_nestful(path, spec=None, results: bool = True) -> Imported:
    """Every record whose calls all have schemas, as an example with one step per call (in order); with
    ``results``, each step carries its call's recorded ``response`` as its result."""
    path = Path(path)
    spec = spec if spec is not None else default_spec(path)
    shared = load_spec(spec) if spec is not None else None
    raws = read_records(path)
    imported = Imported(records=len(raws))
    for index, raw in enumerate(raws):
        where = f"{path}: record {index}"
        record = require_object(raw, where)
        query = text_field(record, "input", where).strip()
        output = list_field(record, "output", where)
        calls = _calls(output, where, imported)
        if results:
            responses = {call.get("label"): call.get("response") for call in output}
            calls = [(name, resolve_references(arguments, responses)) for name, arguments in calls]
        recorded = [
            result_text(call.get("response")) if results else None for call in output if call["name"] != ANSWER_STEP
        ]
        schemas = _record_tools(record, where) if "tools" in record else shared
        if schemas is None:
            raise DataError(
                f"{where}: no tool schemas: the record has no 'tools' and no spec file was given "
                f"(none found beside {path.name} as *-spec.json)"
            )
        imported.offer(query, calls, str(record.get("sample_id", index)), schemas, results=recorded)
    imported.require_examples(path)
    return imported


def resolve_references(value, responses: dict):
    """``value`` (a call's arguments, or any part of them) with every string that is wholly a reference
    (``"$var1.coordinates.latitude$"``) replaced by the value it names in ``responses`` (label → recorded response).
    A path step into a list takes the list's first item unless the step is an index (ComplexFuncBench's responses are
    often one-item lists: ``$var1.coordinates.latitude$`` names ``response[0]["coordinates"]["latitude"]``).  A
    reference that names nothing (unknown label, missing key) stays as it is."""
    if isinstance(value, dict):
        return {key: resolve_references(item, responses) for key, item in value.items()}
    if isinstance(value, list):
        return [resolve_references(item, responses) for item in value]
    match = REFERENCE.fullmatch(value) if isinstance(value, str) else None
    if match is None or responses.get(match[1]) is None:
        return value
    found = responses[match[1]]
    for key in filter(None, match[2].split(".")):
        if isinstance(found, list) and not key.isdigit():
            found = found[0] if found else None
        if isinstance(found, list) and key.isdigit() and int(key) < len(found):
            found = found[int(key)]
        elif isinstance(found, dict) and key in found:
            found = found[key]
        else:
            return value
    return found


def _calls(output: list, where: str, imported: Imported) -> list[tuple[str, dict]]:
    calls = []
    for k, call in enumerate(output):
        name, arguments = call_fields(call, where, f"output[{k}]")
        if name == ANSWER_STEP:
            imported.skipped[SKIP_ANSWER] += 1
            continue
        label = call.get("label")
        if not isinstance(label, str) or not label.strip():
            raise bad(where, f"output[{k}].label", 'missing or empty (each call names its result, e.g. "var1")')
        calls.append((name, arguments))
    return calls


def _record_tools(record: dict, where: str) -> dict[str, dict]:
    return dict(tool_entry(tool, where, f"tools[{k}]") for k, tool in enumerate(list_field(record, "tools", where)))
