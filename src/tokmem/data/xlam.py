"""The xLAM / APIGen function-calling data (Salesforce/xlam-function-calling-60k), for users who have it.

The file is a JSON list of records (or JSON lines), each::

    {"id": 1, "query": "...", "answers": [{"name": "...", "arguments": {...}}, ...], "tools": [{"name": ..., ...}]}

where ``answers`` and ``tools`` may also be JSON strings of those lists (as the dataset ships them).
A tool-calling study takes the tools most often called alone (a *single-tool* sample calls one tool,
perhaps several times), ranks them by that count, keeps ranks a..b (the reference code: ranks 1–50
for the adaptation phase, 51–100 for evaluation), and composes multi-tool queries from their samples as
``tokmem.data.tool_datasets.xlam_dataset`` does.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tokmem.data.procedures import Example
from tokmem.data.toolfiles import (
    Imported,
    bad,
    call_fields,
    calls_example,
    catalog_entry,
    read_records,
    require_object,
    text_field,
)


@dataclass(frozen=True)
class XlamRecord:
    id: str
    query: str
    calls: tuple[tuple[str, dict], ...]  # (tool name, arguments), in the answer's order
    tools: tuple[dict, ...]  # the schemas the record offers

    @property
    def tool_names(self) -> set[str]:
        return {name for name, _ in self.calls}

    def example(self) -> Example:
        return calls_example(self.query, self.calls, self.id)


def load_xlam(path) -> list[XlamRecord]:
    """Read and validate an xLAM file; a bad record is a DataError naming the file, record index and field."""
    path = Path(path)
    return [_record(raw, path, index) for index, raw in enumerate(read_records(path))]


def import_xlam(path) -> Imported:
    """Every record with calls as an example (one with none: no offered tool fits its query); the catalog holds
    the called tools' schemas as the records give them."""
    records = load_xlam(path)
    imported = Imported(records=len(records))
    for record in records:
        schemas = {
            tool["name"]: catalog_entry(tool["name"], tool.get("description"), tool.get("parameters", {}))
            for tool in record.tools
        }
        imported.offer(record.query, list(record.calls), record.id, schemas)
    imported.require_examples(path)
    return imported


EXCLUDED_TOOLS = {"search"}  # the reference code leaves out the catch-all web search


def rank_tools(records: list[XlamRecord]) -> list[tuple[str, int]]:
    """(tool, number of single-tool samples), most frequent first; ties by name, so the ranking is stable.
    As in the reference code, ``search`` is left out and samples with a call of empty arguments do not count."""
    counts = Counter(next(iter(r.tool_names)) for r in records if _single_tool(r))
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def _single_tool(record: XlamRecord) -> bool:
    """A usable single-tool sample: one tool (not an excluded one), every call with arguments."""
    return (
        len(record.tool_names) == 1
        and not record.tool_names & EXCLUDED_TOOLS
        and all(arguments for _, arguments in record.calls)
    )


def single_tool_samples(records, chosen, per_tool, rng) -> dict[str, list[Example]]:
    """Tool → up to ``per_tool`` of its single-tool samples (distinct queries, drawn with ``rng``)."""
    by_tool: dict[str, dict[str, Example]] = {name: {} for name in chosen}
    for record in records:
        if _single_tool(record) and (name := next(iter(record.tool_names))) in by_tool:
            by_tool[name].setdefault(record.query, record.example())
    return {name: rng.sample(list(samples.values()), min(per_tool, len(samples))) for name, samples in by_tool.items()}


def offered_schemas(records, chosen) -> dict[str, dict]:
    """Each chosen tool's schema, as the first record offering it gives it."""
    schemas: dict[str, dict] = {}
    for record in records:
        for schema in record.tools:
            if schema["name"] in chosen:
                schemas.setdefault(schema["name"], schema)
    return {name: schemas[name] for name in chosen}


# ---- reading and validation ----------------------------------------------------------------------------


def _record(raw, path: Path, index: int) -> XlamRecord:
    where = f"{path}: record {index}"
    query = text_field(require_object(raw, where), "query", where)
    tools = _json_list(raw, "tools", where)
    for k, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or not tool["name"].strip():
            raise bad(where, f"tools[{k}]", "expected an object with a non-empty 'name'")
    calls = _calls(_json_list(raw, "answers", where), {tool["name"] for tool in tools}, where)
    return XlamRecord(str(raw.get("id", index)), query, calls, tuple(tools))


def _calls(answers: list, offered: set[str], where: str) -> tuple[tuple[str, dict], ...]:
    calls = tuple(call_fields(answer, where, f"answers[{k}]") for k, answer in enumerate(answers))
    for k, (name, _) in enumerate(calls):
        if name not in offered:
            raise bad(where, f"answers[{k}].name", f"calls '{name}', which the record's 'tools' do not offer")
    return calls


def _json_list(raw: dict, field: str, where: str) -> list:
    """A list, given as such or as a JSON string of one (an empty ``answers``: no tool fits the query)."""
    value = raw.get(field)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise bad(where, field, f"not valid JSON ({err.msg}, column {err.colno})") from None
    if not isinstance(value, list):
        raise bad(where, field, "missing or not a list (nor a JSON string of one)")
    return value
