"""The procedure data contract: one JSON example a line.

    {"query": "...", "steps": [{"procedure": "name", "response": "..."}, ...], "id": optional}

One step is atomic recall; several steps are a chain.  A step may carry ``"result"``: the text its tool returned
(placed after the call in the training sequence, as a tool message, and never trained on).  After steps whose last
carries a result, ``"answer"`` (optional) is the assistant's closing answer in words, trained as a response is.  A catalog file gives
``{"name": ..., "description": ..., "parameters": {JSON schema}}`` per line, or a JSON list of them (``parameters``
optional: a tool's arguments schema in OpenAI's function format).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tokmem.errors import DataError
from tokmem.io import read_jsonl, read_text, write_text_atomic
from tokmem.schemas import decoding_schema, is_written_in, key_orders


def stable_hash(text: str) -> int:
    """The MD5 of ``text`` as a 128-bit number: the same on every machine and run (splits that never move)."""
    return int(hashlib.md5(text.encode("utf-8")).hexdigest(), 16)


@dataclass(frozen=True)
class Step:
    procedure: str
    response: str
    result: str | None = None  # the tool's output for this call (JSON text or prose), when known

    @property
    def call_arguments(self) -> str | None:
        """For a step that calls its own procedure as a tool (``response`` is ``{"name": procedure,
        "arguments": {…}}``), the arguments as compact JSON; None for any other step."""
        try:
            call = json.loads(self.response)
        except ValueError:
            return None
        if not isinstance(call, dict) or set(call) != {"name", "arguments"} or call["name"] != self.procedure:
            return None
        return arguments_json(call["arguments"]) if isinstance(call["arguments"], dict) else None


def arguments_json(arguments: dict) -> str:
    """Arguments as compact JSON in the order given: the text a tool's memory token is followed by."""
    return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))


def schema_order(arguments: dict, parameters: dict) -> dict:
    """``arguments`` as given where they are written in one of the schema's key orders (``schemas.key_orders``: the
    orders schema-bound decoding writes), else with the schema's keys first, in the schema's order, then any others
    as given.  Training lays out a tool's arguments so where its schema is known."""
    if any(is_written_in(arguments, keys) for keys in key_orders(parameters)):
        return arguments
    known = [key for key in parameters.get("properties", {}) if key in arguments]
    return {key: arguments[key] for key in [*known, *(k for k in arguments if k not in known)]}


def call_json(name: str, arguments: dict) -> str:
    """One call as compact JSON, keys in a stable order: name, then the arguments as given."""
    return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False, separators=(",", ":"))


def assemble_call(name: str, arguments: str) -> str:
    """The whole call from a tool's name and the arguments text generated after its memory token; text that
    is not a JSON object is kept verbatim inside the call, so a reader sees what was generated."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return call_json(name, parsed)
    return '{"name":' + json.dumps(name, ensure_ascii=False) + ',"arguments":' + arguments + "}"


def tool_procedures(examples) -> set[str]:
    """The procedures all of whose steps are calls of themselves (see ``Step.call_arguments``)."""
    steps: dict[str, list[Step]] = {}
    for example in examples:
        for step in example.steps:
            steps.setdefault(step.procedure, []).append(step)
    return {name for name, own in steps.items() if all(s.call_arguments is not None for s in own)}


@dataclass(frozen=True)
class Example:
    query: str
    steps: tuple[Step, ...]
    id: str | None = field(default=None)
    answer: str | None = None  # the closing answer in words after the last step's result, when the data has one

    @property
    def ends_with_result(self) -> bool:
        """Whether the last step carries its tool's result: the assistant speaks again after it (an answer or not)."""
        return bool(self.steps) and self.steps[-1].result is not None

    @property
    def procedures(self) -> list[str]:
        return [s.procedure for s in self.steps]

    @property
    def response(self) -> str:
        """The whole answer as shown to a reader: one line per segment."""
        return "\n".join(s.response for s in self.steps)

    def to_json(self) -> dict:
        out = {
            "query": self.query,
            "steps": [{k: v for k, v in asdict(s).items() if v is not None} for s in self.steps],
        }
        if self.answer is not None:
            out["answer"] = self.answer
        if self.id is not None:
            out["id"] = self.id
        return out


def _where(path, line: int, field_name: str | None = None) -> str:
    loc = f"{path}:{line}"
    return f"{loc}: field '{field_name}'" if field_name else loc


def _text(obj: dict, key: str, path, line: int, within: str = "") -> str:
    """``obj[key]``, which must be a non-empty string; ``within`` names the object in the error (``steps[0].``)."""
    value = obj.get(key)
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{_where(path, line, within + key)}: missing or empty (must be a non-empty string)")
    return value


def parse_example(obj, path="<data>", line: int = 1) -> Example:
    """Validate one decoded JSON object against the contract; errors name file, line and field."""
    if not isinstance(obj, dict):
        raise DataError(f"{_where(path, line)}: expected a JSON object, got {type(obj).__name__}")
    query = _text(obj, "query", path, line)
    steps = obj.get("steps")
    if not isinstance(steps, list):
        raise DataError(
            f"{_where(path, line, 'steps')}: missing (a list of steps; an empty list: an off-topic query, left to the "
            "plain backbone)"
        )
    parsed = []
    for k, step in enumerate(steps):
        where = f"steps[{k}]"
        if not isinstance(step, dict):
            raise DataError(f"{_where(path, line, where)}: expected an object with 'procedure' and 'response'")
        name = _text(step, "procedure", path, line, f"{where}.")
        result = step.get("result")
        if result is not None and not isinstance(result, str):
            raise DataError(
                f"{_where(path, line, where + '.result')}: must be a string (the tool's output as text, e.g. JSON)"
            )
        parsed.append(Step(name.strip(), _text(step, "response", path, line, f"{where}."), result))
    answer = None if obj.get("answer") is None else _text(obj, "answer", path, line)
    if answer is not None and (not parsed or parsed[-1].result is None):
        last = f"steps[{len(parsed) - 1}] has no 'result'" if parsed else "there are no steps"
        raise DataError(f"{_where(path, line, 'answer')}: a final answer follows the last step's result, but {last}")
    ex_id = obj.get("id")
    return Example(query=query, steps=tuple(parsed), id=None if ex_id is None else str(ex_id), answer=answer)


def load_examples(path, known_procedures=None) -> list[Example]:
    """Read a procedures JSONL file.

    ``known_procedures``: when given (e.g. at eval time), a step naming any other
    procedure is an error that names its file and line.
    """
    path = Path(path)
    known = None if known_procedures is None else set(known_procedures)
    examples = []
    for number, obj in read_jsonl(path):
        example = parse_example(obj, path, number)
        if known is not None:
            for k, name in enumerate(example.procedures):
                if name not in known:
                    raise DataError(
                        f"{_where(path, number, f'steps[{k}].procedure')}: unknown procedure '{name}' "
                        f"(the bank has {len(known)}: {', '.join(sorted(known)[:8])}{', …' if len(known) > 8 else ''})"
                    )
        examples.append(example)
    if not examples:
        raise DataError(f"{path}: no examples (the file is empty)")
    return examples


def save_examples(examples, path) -> None:
    """Write the examples as JSON lines, atomically (a crash never leaves half a file)."""
    write_text_atomic(path, "".join(json.dumps(e.to_json(), ensure_ascii=False) + "\n" for e in examples))


def save_catalog(entries, path) -> None:
    """Write catalog entries (``{"name", "description", …}`` objects) as JSON lines, atomically; ``load_catalog`` reads them."""
    write_text_atomic(path, "".join(json.dumps(entry, ensure_ascii=False) + "\n" for entry in entries))


def load_catalog(path) -> dict[str, str]:
    """Read ``{"name", "description"}`` lines into a name → description dict."""
    return {name: entry["description"] for name, entry in _catalog_entries(path).items()}


def load_schemas(path) -> dict[str, dict]:
    """The catalog's tool schemas (``"parameters"``: OpenAI's function format, a JSON schema object), name → schema,
    for the entries that have one.  Each is checked as its arguments will decode under it (``decoding_schema``): one
    that schema-bound decoding cannot take is a ``SchemaError`` naming the line, the tool and the field."""
    return {
        name: entry["parameters"]
        for name, entry in _catalog_entries(path).items()
        if entry.get("parameters") is not None
    }


def _catalog_records(path: Path):
    """(number, parsed entry) of a catalog: JSON lines (number: the line), or one JSON list (number: the entry, from 1)."""
    text = read_text(path)
    if not text.lstrip().startswith("["):
        return read_jsonl(path)
    try:
        entries = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(f"{path}: invalid JSON ({err.msg} at line {err.lineno}, column {err.colno})") from None
    return enumerate(entries, start=1)


def _catalog_entries(path) -> dict[str, dict]:
    path = Path(path)
    catalog = {}
    for number, obj in _catalog_records(path):
        if not isinstance(obj, dict):
            raise DataError(f"{path}:{number}: expected a JSON object")
        name, description = obj.get("name"), obj.get("description", "")
        if not isinstance(name, str) or not name.strip():
            raise DataError(f"{_where(path, number, 'name')}: missing or empty")
        if not isinstance(description, str):
            raise DataError(f"{_where(path, number, 'description')}: must be a string")
        parameters = obj.get("parameters")
        if parameters is not None and (
            not isinstance(parameters, dict) or not isinstance(parameters.get("properties", {}), dict)
        ):
            raise DataError(
                f"{_where(path, number, 'parameters')}: must be a JSON schema object (with 'properties' an object)"
            )
        if parameters is not None:
            decoding_schema(parameters, where=f"{path}:{number}: tool {name.strip()!r:.80}: parameters")
        catalog[name.strip()] = {"description": description, "parameters": parameters}
    return catalog
