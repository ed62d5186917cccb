"""Berkeley Function Calling Leaderboard (BFCL) files: question files and their ``possible_answer`` files.

A question file ``BFCL_v4_<category>.json`` holds one JSON object a line, ``{"id", "question", …}``;
its gold answers are in ``possible_answer/`` beside it, under the same name, matched by ``id``.

**Single-turn** categories (``parallel``, ``live_multiple``, …): ``question`` is one turn of messages
(the user's message is the query; a system message is left out, and counted), ``function`` the schemas
the record offers, and the gold answer a list of calls ``{"tool": {"arg": [acceptable values…]}}``.
An argument's gold value is its first acceptable value that is not ``""``; an argument whose only
acceptable value is ``""`` may be left out, and is.  Inside a dict value, the same rule applies key by
key (BFCL nests acceptable-value lists there).

**Multi-turn** categories (``multi_turn_*``): ``question`` is a conversation, a list of user turns, and
the gold answer one list of Python call strings per turn, e.g. ``"mv(source='a.pdf', destination='tmp')"``.
Each user turn with gold calls becomes one example (id ``<id>/turn-<k>``): the query is that turn's
user message alone, the steps its calls in order.  Turns assume the state earlier turns left (the
current directory after ``cd``, a login), which the example does not carry.  Call strings are parsed
with ``ast`` (never evaluated): keyword arguments must be literals; positional ones are mapped to the
tool's parameters in schema order (BFCL writes its function docs in the signature's order, the order in
which Python binds them).  The tools' schemas are the ``multi_turn_func_doc/*.json`` files beside the
question file.  With ``execute``, every gold call of a conversation is run in order on BFCL's simulated
backends (`tokmem.data.bfcl_backends`), from its ``initial_config``, and each step carries the call's result.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tokmem.data.bfcl_backends import Conversation
from tokmem.data.toolfiles import (
    Imported,
    bad,
    list_field,
    read_records,
    require_object,
    text_field,
    tool_entry,
)
from tokmem.errors import DataError

ANSWERS = "possible_answer"
FUNC_DOCS = "multi_turn_func_doc"
SKIP_NO_ANSWERS = "question files with no possible_answer file (left out of a folder import)"
SKIP_OTHER_ROLES = "system and other non-user messages (the query is the user's message)"


def import_bfcl(path, execute: bool = False) -> Imported:
    """A question file, or a BFCL folder: every ``BFCL_*.json`` in it that has a possible_answer file; with
    ``execute``, the multi-turn calls' results from BFCL's simulated backends."""
    path = Path(path)
    imported = Imported()
    if path.is_dir():
        files = sorted(path.glob("BFCL_*.json"))
        answered = [file for file in files if (file.parent / ANSWERS / file.name).is_file()]
        if not answered:
            raise DataError(f"{path}: no BFCL_*.json question file with a {ANSWERS}/ file beside it")
        if len(answered) < len(files):
            imported.skipped[SKIP_NO_ANSWERS] += len(files) - len(answered)
    else:
        answered = [path]
    for file in answered:
        _import_file(file, imported, execute)
    imported.require_examples(path)
    return imported


def _import_file(path: Path, imported: Imported, execute: bool) -> None:
    questions = read_records(path)
    answer_path = path.parent / ANSWERS / path.name
    if not answer_path.is_file():
        raise DataError(f"{path}: no gold answers: expected {answer_path}")
    answers = _answers_by_id(answer_path)
    multi_turn = "multi_turn" in path.name
    docs = _func_docs(path.parent / FUNC_DOCS) if multi_turn else None
    imported.records += len(questions)
    for index, raw in enumerate(questions):
        where = f"{path}: record {index}"
        question = require_object(raw, where)
        qid = text_field(question, "id", where)
        if qid not in answers:
            raise bad(where, "id", f"'{qid}' has no gold answer in {answer_path}")
        answer_where, gold = answers[qid]
        if multi_turn:
            run = (
                Conversation(question.get("involved_classes"), question.get("initial_config"), where)
                if execute
                else None
            )
            _conversation(question, qid, where, gold, answer_where, docs, imported, run)
        else:
            _single_turn(question, qid, where, gold, answer_where, imported)


def _answers_by_id(path: Path) -> dict[str, tuple[str, list]]:
    """id → (where the answer is, its ground_truth list)."""
    answers = {}
    for index, raw in enumerate(read_records(path)):
        where = f"{path}: record {index}"
        answer = require_object(raw, where)
        answers[text_field(answer, "id", where)] = (where, list_field(answer, "ground_truth", where))
    return answers


# ---- single-turn ---------------------------------------------------------------------------------------


def _single_turn(question, qid, where, gold, answer_where, imported: Imported) -> None:
    turns = list_field(question, "question", where)
    if len(turns) != 1:
        raise bad(where, "question", f"expected one turn in a single-turn file, got {len(turns)}")
    query = _user_query(turns[0], where, "question[0]", imported)
    schemas = dict(
        tool_entry(tool, where, f"function[{k}]") for k, tool in enumerate(list_field(question, "function", where))
    )
    calls = [_gold_call(call, answer_where, f"ground_truth[{k}]") for k, call in enumerate(gold)]
    imported.offer(query, calls, qid, schemas)


def _user_query(turn, where: str, field: str, imported: Imported) -> str | None:
    """The turn's user message (several: joined by a blank line), or None when it has none."""
    if not isinstance(turn, list):
        raise bad(where, field, "expected a list of messages")
    users = []
    for m, message in enumerate(turn):
        if (
            not isinstance(message, dict)
            or not isinstance(message.get("role"), str)
            or not isinstance(message.get("content"), str)
        ):
            raise bad(where, f"{field}[{m}]", 'expected a message {"role": …, "content": "…"}')
        if message["role"] != "user":
            imported.skipped[SKIP_OTHER_ROLES] += 1
        elif message["content"].strip():
            users.append(message["content"])
    return "\n\n".join(users) if users else None


def _gold_call(call, where: str, field: str) -> tuple[str, dict]:
    if not isinstance(call, dict) or len(call) != 1:
        raise bad(where, field, "expected an object with one key, the tool's name")
    ((name, arguments),) = call.items()
    if not isinstance(arguments, dict):
        raise bad(where, f"{field}.{name}", "expected an object of arguments")
    for argument, acceptable in arguments.items():
        if not isinstance(acceptable, list) or not acceptable:
            raise bad(where, f"{field}.{name}.{argument}", "expected a non-empty list of acceptable values")
    return name, _resolve(arguments)


def _resolve(arguments: dict) -> dict:
    """Each argument's first acceptable value that is not "" (resolved in turn); arguments with no such value are left out."""
    gold = {}
    for name, acceptable in arguments.items():
        values = [value for value in acceptable if value != ""]
        if values:
            gold[name] = _value(values[0])
    return gold


def _value(value):
    """A gold value; a dict of acceptable-value lists (BFCL's nesting) is resolved key by key, in lists too."""
    if isinstance(value, dict) and all(isinstance(v, list) for v in value.values()):
        return _resolve(value)
    if isinstance(value, list):
        return [_value(item) for item in value]
    return value


# ---- multi-turn ----------------------------------------------------------------------------------------


def _conversation(
    question, qid, where, gold, answer_where, docs: dict[str, dict], imported: Imported, run: Conversation | None
) -> None:
    """Each turn with calls an example; with ``run``, every call is run in order (those of turns left out too: the
    state carries on) and each step has its result."""
    turns = list_field(question, "question", where)
    if len(gold) != len(turns):
        raise bad(answer_where, "ground_truth", f"has {len(gold)} turns, the question has {len(turns)}")
    for t, (turn, strings) in enumerate(zip(turns, gold)):
        field = f"ground_truth[{t}]"
        if not isinstance(strings, list) or not all(isinstance(s, str) for s in strings):
            raise bad(answer_where, field, "expected a list of call strings")
        query = _user_query(turn, where, f"question[{t}]", imported)
        calls = [parse_call(s, answer_where, f"{field}[{c}]", docs) for c, s in enumerate(strings)]
        results = [run.run(name, arguments) for name, arguments in calls] if run else None
        imported.offer(query, calls, f"{qid}/turn-{t}", docs, unit="turns", results=results)


def parse_call(text: str, where: str, field: str, docs: dict[str, dict]) -> tuple[str, dict | None]:
    """(tool name, keyword arguments) of a Python call string, parsed by ``ast`` and never evaluated.

    Positional arguments take the tool's parameters in schema order; the arguments are None when
    ``docs`` has no schema for the tool (so they cannot be named).
    """
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as err:
        raise bad(where, field, f"not a Python call ({err.msg}): {text!r}") from None
    name = _dotted(node.func) if isinstance(node, ast.Call) else None
    if name is None:
        raise bad(where, field, f"expected a call like tool(arg=value): {text!r}")
    if name not in docs:
        return name, None
    parameters = list(docs[name]["parameters"].get("properties", {}))
    if len(node.args) > len(parameters):
        raise bad(
            where,
            field,
            f"{len(node.args)} positional arguments, but '{name}' has {len(parameters)} parameters: {text!r}",
        )
    arguments = {parameter: _literal(arg, where, field, text) for parameter, arg in zip(parameters, node.args)}
    for keyword in node.keywords:
        if keyword.arg is None or keyword.arg in arguments:
            problem = "**kwargs" if keyword.arg is None else f"argument '{keyword.arg}' given twice"
            raise bad(where, field, f"{problem}: {text!r}")
        arguments[keyword.arg] = _literal(keyword.value, where, field, text)
    return name, arguments


def _dotted(node) -> str | None:
    """``f`` or ``a.b.f`` as a name; None for any other callee."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and (owner := _dotted(node.value)):
        return f"{owner}.{node.attr}"
    return None


def _literal(node, where: str, field: str, text: str):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise bad(where, field, f"argument {ast.unparse(node)!r} is not a literal value: {text!r}") from None


def _func_docs(folder: Path) -> dict[str, dict]:
    """Tool name → catalog entry, from every JSON-lines file in ``multi_turn_func_doc/``."""
    files = sorted(folder.glob("*.json"))
    if not files:
        raise DataError(
            f"{folder}: no multi-turn function docs (*.json) here; the multi-turn tools' schemas are needed"
        )
    return dict(tool_entry(tool, f"{file}: record {k}") for file in files for k, tool in enumerate(read_records(file)))
