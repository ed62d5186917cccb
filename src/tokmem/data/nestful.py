"""NESTFUL files (IBM): queries answered by sequences of API calls, later calls using earlier results.

A data file is a JSON list (or JSON lines) of records::

    {"input": "query", "output": [{"name": "Search_Hotels", "arguments": {...}, "label": "var1"}, ...], ...}

An argument may take an earlier call's result, written ``"$var1.path.to.field$"``; it stays that string
(the model learns to write the reference).  A call's recorded result (``"response"``, as ComplexFuncBench's
records carry the real API responses) becomes its step's ``result``.  The tools' schemas come with each record (``"tools": [...]``)
or from a spec file: a JSON list of ``{"name", "description", "query_parameters" | "parameters", …}``.
IBM ships the two side by side as ``X-data.json`` and ``X-spec.json``, so the spec defaults to that
neighbour.  A spec's flat ``{param: {"type", "description", "required": bool, …}}`` becomes a JSON
schema (``{"type": "object", "properties", "required"}``, empty ``enum`` / null ``default`` left out).

Some NESTFUL files end each answer with ``{"name": "var_result", "arguments": {...}}``: the final
answer (which results to return), not a tool call.  It is left out of the steps and counted.
"""

from __future__ import annotations

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
