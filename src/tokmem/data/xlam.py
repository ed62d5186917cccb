"""The xLAM / APIGen function-calling data (Salesforce/xlam-function-calling-60k), for users who have it.

The file is a JSON list of records (or JSON lines), each::

    {"id": 1, "query": "...", "answers": [{"name": "...", "arguments": {...}}, ...], "tools": [{"name": ..., ...}]}

where ``answers`` and ``tools`` may also be JSON strings of those lists (as the dataset ships them).
A tool-calling study takes the tools most often called alone (a *single-tool* sample calls one tool,
perhaps several times), ranks them by that count, keeps ranks a..b (the paper: 50 evaluation tools,
and another 50 for the adaptation phase), and composes multi-tool queries from their samples as
``tokmem.data.tools.assemble`` does.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tokmem.data.procedures import Example, Step, read_text
from tokmem.data.tools import ToolData, assemble, call_json
from tokmem.errors import DataError


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
        return Example(self.query, tuple(Step(name, call_json(name, args)) for name, args in self.calls), id=self.id)


def load_xlam(path) -> list[XlamRecord]:
    """Read and validate an xLAM file; a bad record is a DataError naming the file, record index and field."""
    path = Path(path)
    return [_record(raw, path, index) for index, raw in enumerate(_raw_records(path))]


def rank_tools(records: list[XlamRecord]) -> list[tuple[str, int]]:
    """(tool, number of single-tool samples), most frequent first; ties by name, so the ranking is stable."""
    counts = Counter(next(iter(r.tool_names)) for r in records if len(r.tool_names) == 1)
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def xlam_dataset(
    path,
    ranks: tuple[int, int] = (1, 50),
    per_tool: int = 50,
    train_multi: int = 5000,
    test_multi: int = 500,
    max_calls: int = 4,
    train_max_calls: int | None = None,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> ToolData:
    """A study over the tools ranked ``ranks`` (1-based, inclusive) by single-tool frequency.

    Each tool keeps up to ``per_tool`` of its single-tool samples (distinct queries, drawn with
    ``seed``); train and test are built by ``assemble`` (paper: 5,000 / 500 composed, at most 4 calls).
    """
    records = load_xlam(path)
    first, last = ranks
    ranking = rank_tools(records)
    if not 1 <= first <= last or last > len(ranking):
        raise DataError(f"{path}: cannot take tool ranks {first}..{last}: it has {len(ranking)} single-tool tools")
    chosen = [name for name, _ in ranking[first - 1 : last]]
    pools = _pools(records, chosen, per_tool, random.Random(f"{seed}:xlam"))
    return assemble(pools, _schemas(records, chosen), train_multi, test_multi, max_calls, train_max_calls,
                    test_fraction, seed)


def _pools(records, chosen, per_tool, rng) -> dict[str, list[Example]]:
    by_tool: dict[str, dict[str, Example]] = {name: {} for name in chosen}
    for record in records:
        names = record.tool_names
        if len(names) == 1 and (name := next(iter(names))) in by_tool:
            by_tool[name].setdefault(record.query, record.example())
    return {name: rng.sample(list(samples.values()), min(per_tool, len(samples))) for name, samples in by_tool.items()}


def _schemas(records, chosen) -> dict[str, dict]:
    schemas: dict[str, dict] = {}
    for record in records:
        for schema in record.tools:
            if schema["name"] in chosen:
                schemas.setdefault(schema["name"], schema)
    return {name: schemas[name] for name in chosen}


# ---- reading and validation ----------------------------------------------------------------------------

def _raw_records(path: Path) -> list:
    text = read_text(path)
    if text.lstrip().startswith("["):
        return _decode(text, path)
    return [_decode(line, path, f"line {number}") for number, line in enumerate(text.splitlines(), 1) if line.strip()]


def _decode(text: str, path: Path, where: str = ""):
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        location = f"{where}, " if where else ""
        problem = f"{location}{err.msg} at line {err.lineno}, column {err.colno}"
        raise DataError(f"{path}: invalid JSON ({problem})") from None


def _record(raw, path: Path, index: int) -> XlamRecord:
    where = f"{path}: record {index}"
    if not isinstance(raw, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    query = raw.get("query")
    if not isinstance(query, str) or not query.strip():
        raise _bad(where, "query", "missing or empty (must be a non-empty string)")
    tools = _json_list(raw, "tools", where)
    for k, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or not tool["name"].strip():
            raise _bad(where, f"tools[{k}]", "expected an object with a non-empty 'name'")
    calls = _calls(_json_list(raw, "answers", where), {tool["name"] for tool in tools}, where)
    return XlamRecord(str(raw.get("id", index)), query, calls, tuple(tools))


def _calls(answers: list, offered: set[str], where: str) -> tuple[tuple[str, dict], ...]:
    for k, answer in enumerate(answers):
        if not isinstance(answer, dict) or not isinstance(answer.get("name"), str):
            raise _bad(where, f"answers[{k}]", "expected an object with a 'name' and 'arguments'")
        if not isinstance(answer.get("arguments"), dict):
            raise _bad(where, f"answers[{k}].arguments", "missing or not an object")
        if answer["name"] not in offered:
            problem = f"calls '{answer['name']}', which the record's 'tools' do not offer"
            raise _bad(where, f"answers[{k}].name", problem)
    return tuple((answer["name"], answer["arguments"]) for answer in answers)


def _json_list(raw: dict, field: str, where: str) -> list:
    """A list, given as such or as a JSON string of one (an empty ``answers``: no tool fits the query)."""
    value = raw.get(field)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise _bad(where, field, f"not valid JSON ({err.msg}, column {err.colno})") from None
    if not isinstance(value, list):
        raise _bad(where, field, "missing or not a list (nor a JSON string of one)")
    return value


def _bad(where: str, field: str, problem: str) -> DataError:
    return DataError(f"{where}, field '{field}': {problem}")
