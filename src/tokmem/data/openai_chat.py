"""OpenAI's chat fine-tuning format (the format most function-calling data sets ship in), one record a line::

    {"messages": [{"role": "user", "content": "…"},
                  {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                        "function": {"name": "f", "arguments": "{…}"}}]},
                  {"role": "tool", "tool_call_id": "c1", "content": "…"}, …],
     "tools": [{"type": "function", "function": {"name": "f", "description": "…", "parameters": {JSON schema}}}]}

A record becomes one example: the query is the last user message before the first tool calls; the steps are the
calls of the assistant turns after it, in order (until the next user message: later exchanges are counted, not
used), each with its result from the ``tool`` message of the same ``tool_call_id``; the assistant's text after the
last result (before the next user message) is the example's final ``answer``.  The catalog comes from the
record's ``tools``.  ``arguments`` may be JSON text (OpenAI's) or an object.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokmem.data.toolfiles import Imported, bad, list_field, read_records, require_object, tool_entry

LATER_TURNS = "user turns after the first tool calls (only the first exchange of a record is used)"


def import_openai(path) -> Imported:
    path = Path(path)
    raws = read_records(path)
    imported = Imported(records=len(raws))
    for index, raw in enumerate(raws):
        where = f"{path}: record {index}"
        record = require_object(raw, where)
        messages = list_field(record, "messages", where)
        schemas = dict(_tool(tool, where, k) for k, tool in enumerate(record.get("tools") or []))
        query, calls, results, answer = _exchange(messages, where, imported)
        imported.offer(query, calls, str(record.get("id", index)), schemas, results=results, answer=answer)
    imported.require_examples(path)
    return imported


def _tool(tool, where: str, k: int) -> tuple[str, dict]:
    if not isinstance(tool, dict) or not isinstance(tool.get("function"), dict):
        raise bad(
            where, f"tools[{k}]", 'expected {"type": "function", "function": {"name", "description", "parameters"}}'
        )
    return tool_entry(tool["function"], where, f"tools[{k}].function")


def _exchange(messages: list, where: str, imported: Imported):
    """(query, [(name, arguments)], [result], final answer or None) of the record's first exchange with tool calls."""
    first = next(
        (
            i
            for i, m in enumerate(messages)
            if isinstance(m, dict) and m.get("role") == "assistant" and m.get("tool_calls")
        ),
        None,
    )
    users = [
        i
        for i, m in enumerate(messages[: first if first is not None else len(messages)])
        if _role(m, where, i) == "user"
    ]
    query = _content(messages[users[-1]], where, users[-1]) if users else None
    if first is None:
        return query, [], [], None
    calls, ids = [], []
    end = next((i for i in range(first, len(messages)) if _role(messages[i], where, i) == "user"), len(messages))
    if end < len(messages):
        imported.skipped[LATER_TURNS] += 1
    for i in range(first, end):
        for k, call in enumerate(messages[i].get("tool_calls") or []):
            name, arguments = _call(call, where, f"messages[{i}].tool_calls[{k}]")
            calls.append((name, arguments))
            ids.append(call.get("id"))
    results = {
        m.get("tool_call_id"): _content(m, where, i)
        for i, m in enumerate(messages[first:end], first)
        if m.get("role") == "tool"
    }
    unknown = sorted(set(results) - set(ids), key=str)
    if unknown:
        raise bad(where, "messages", f"a 'tool' message answers tool_call_id {unknown[0]!r}, which no call has")
    results = [results.get(call_id) for call_id in ids]
    return query, calls, results, _final_answer(messages[first:end]) if results and results[-1] is not None else None


def _final_answer(messages: list) -> str | None:
    """The text of the exchange's last assistant message when it is an answer in words (no calls) after the calls."""
    last = messages[-1]
    text = last.get("content") if last.get("role") == "assistant" and not last.get("tool_calls") else None
    return text if isinstance(text, str) and text.strip() else None


def _role(message, where: str, i: int) -> str:
    if not isinstance(message, dict) or message.get("role") not in ("system", "user", "assistant", "tool"):
        raise bad(where, f"messages[{i}].role", "expected an object with role system, user, assistant or tool")
    return message["role"]


def _content(message: dict, where: str, i: int) -> str:
    content = message.get("content")
    if not isinstance(content, str):
        raise bad(where, f"messages[{i}].content", "missing or not a string")
    return content


def _call(call, where: str, field: str) -> tuple[str, dict]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"].strip():
        raise bad(where, f"{field}.function.name", "missing or empty")
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError as err:
            raise bad(where, f"{field}.function.arguments", f"not valid JSON ({err})") from None
    if not isinstance(arguments, dict):
        raise bad(where, f"{field}.function.arguments", "not a JSON object")
    return function["name"], arguments
