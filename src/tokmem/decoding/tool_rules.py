"""OpenAI's tool rules, one place for ``tokmem.chat`` and the server: which rows a turn may route to, the schemas its
arguments decode under, the calls it may not repeat, and its tokens read back as a ``Reply``.

The model answers with tool calls when its turn starts with a tool row's memory token (the name comes from the
row, the arguments are what follows, under the tool's schema where the bank has one); several calls chain in one
turn; EOS ends the turn.  ``tool_choice`` (OpenAI's): ``"auto"`` routes as TokMem does (the open-set rule may
answer with text), ``"none"`` masks the tool rows, ``"required"`` forces the best tool row, ``{"type": "function",
"function": {"name": …}}`` forces that one call, once; ``tools`` (names or OpenAI tool objects) limits routing to
those rows, and a tool object's ``parameters`` bind its arguments instead of the bank's schema (``tool_schemas``).

A turn does not repeat itself: under ``tool_choice="auto"`` a call the conversation already answered since the
user's last message (the same tool, the same arguments) is dropped from the turn, and a turn of nothing but such
calls is decoded again without those tools' rows (``without_repeats``) — so a small model that would loop on its
favourite tool answers from the result instead; and under any ``tool_choice`` a call identical to an earlier one of
the same turn is dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

from tokmem.decoding.conversation import assistant_calls
from tokmem.decoding.decode import open_set_threshold, to_generation
from tokmem.errors import DataError, clipped, listed
from tokmem.model import TokMemModel
from tokmem.schemas import UNTRAINED


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI's ``function.arguments``

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class Reply:
    content: str | None
    tool_calls: list[ToolCall]
    finish_reason: str  # "tool_calls", "stop" or "length"

    @property
    def message(self) -> dict:
        """The assistant message to append to the conversation."""
        message = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [call.to_openai() for call in self.tool_calls]
        return message


def answered_calls(messages: list[dict], tool_choice="auto") -> set[tuple[str, str]]:
    """The calls the next turn may not repeat, as (name, arguments as canonical JSON): those the conversation made
    since the user's last message (each has its result: ``conversation_ids`` checks), when the model chooses its
    tools (``tool_choice="auto"``); none when the client forces a choice (``"required"`` or a named tool may call
    the same again on purpose)."""
    if tool_choice != "auto":
        return set()
    last_user = max((i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"), default=-1)
    return {
        _call_key(call["function"].get("name"), call["function"].get("arguments"))
        for message in messages[last_user + 1 :]
        for call in assistant_calls(message)
        if isinstance(call, dict) and isinstance(call.get("function"), dict)
    }


def without_repeats(reply: Reply, answered: set[tuple[str, str]], turn: int) -> tuple[Reply, list[str]]:
    """``reply`` without the calls that repeat one of ``answered`` or an earlier call of the same turn (the rest keep
    their order, ids renumbered), and the tools a turn of nothing but repeats of ``answered`` named (else []): that
    turn is to be decoded again without their rows."""
    seen, kept = set(answered), []
    for call in reply.tool_calls:
        key = _call_key(call.name, call.arguments)
        if key not in seen:
            seen.add(key)
            kept.append(call)
    if reply.tool_calls and not kept:
        return reply, sorted({call.name for call in reply.tool_calls})
    if len(kept) == len(reply.tool_calls):
        return reply, []
    calls = [ToolCall(call_id(turn, k), call.name, call.arguments) for k, call in enumerate(kept)]
    return Reply(reply.content, calls, reply.finish_reason), []


def _call_key(name, arguments) -> tuple[str, str]:
    """A call as compared for repeats: its name and its arguments as canonical JSON (key order and spacing aside;
    text that is not JSON, or nested past Python's JSON, as it is)."""
    try:
        return name, json.dumps(json.loads(arguments or "{}"), sort_keys=True)
    except (TypeError, ValueError, RecursionError):
        return name, str(arguments)


def tool_routing(model: TokMemModel, tools, tool_choice, threshold: float | None) -> tuple[torch.Tensor, int, float]:
    """(the bank rows the turn may use, the memory id forced first or -1, routing's threshold) for OpenAI's ``tools``
    and ``tool_choice``; ``threshold`` is the open-set rule's (None: the bank's, ``decode.open_set_threshold``), 0 for
    ``"required"`` (it always routes, among the allowed tool rows).  Bad names are ``DataError``s naming the field (a
    server's 400).  ``tokmem.chat`` and the server (``tokmem.serve``) both map a request through here."""
    bank, threshold = model.bank, open_set_threshold(model.bank, threshold)
    names = (
        None if tools is None else [t if isinstance(t, str) else (t.get("function") or {}).get("name") for t in tools]
    )
    unknown = [n for n in names or [] if n not in bank.tool_names()]
    if unknown:
        raise DataError(
            f"tools: {listed(unknown)} not a tool in the bank (its tools: {listed(sorted(bank.tool_names())) or 'none'})"
        )
    tool_rows = torch.tensor([kind == "tool" for kind in bank.kinds], dtype=torch.bool)
    allowed = torch.tensor([names is None or n in names for n in bank.names], dtype=torch.bool)
    if tool_choice == "none":
        allowed &= ~tool_rows
    elif tool_choice == "required":
        allowed &= tool_rows
    elif tool_choice != "auto":
        named = (tool_choice.get("function") or {}).get("name") if isinstance(tool_choice, dict) else None
        if named not in bank.tool_names() or (names is not None and named not in names):
            raise DataError(
                f"tool_choice: {clipped(repr(tool_choice))} is not 'auto', 'none', 'required' or one of the allowed "
                "tools"
            )
        allowed = torch.tensor([n == named for n in bank.names], dtype=torch.bool)
        return allowed.to(model.device), model.memory_id(named), threshold
    if tool_choice == "required" and not allowed.any():
        raise DataError("tool_choice 'required': the bank has no tool among the allowed ones")
    return allowed.to(model.device), -1, 0.0 if tool_choice == "required" else threshold


def tool_schemas(model: TokMemModel, tools) -> list[dict | None] | None:
    """Per bank row, the schema a tool's arguments decode under: the client's ``parameters`` where a tool of ``tools``
    (OpenAI tool objects; names are ``tool_routing``'s to check) brings them, else the bank's; None when no tool
    brings any (the bank's, all of them).

    The client's schema binds (OpenAI's ``strict``, or any schema that differs from the bank's: other types, enums,
    required keys, fewer properties), with its properties in the order the tool learned them; but it may not name a
    parameter that is not the bank's tool's: the model cannot write it, so that is a ``DataError`` naming the tool
    and both sets of names (a server's 400).  An optional parameter the tool's training never gave is left out, as
    from the bank's schema; one the client requires is kept.  A tool the bank keeps no schema for takes the client's
    as it is."""
    schemas, given = list(model.bank.schemas), False
    for k, tool in enumerate(tools or []):
        function = tool.get("function") if isinstance(tool, dict) else None
        parameters = function.get("parameters") if isinstance(function, dict) else None
        if parameters is not None:
            row, given = model.bank.row(function.get("name")), True
            schemas[row] = _client_schema(parameters, schemas[row], function["name"], f"tools[{k}].function.parameters")
    return schemas if given else None


def _client_schema(parameters, learned: dict | None, name: str, where: str) -> dict:
    """The client's ``parameters`` reconciled with the bank's schema ``learned`` (see ``tool_schemas``): an optional
    argument the tool's training calls never gave (``schemas.UNTRAINED``) is left out, as from the bank's own."""
    properties = parameters.get("properties", {}) if isinstance(parameters, dict) else None
    if not isinstance(properties, dict) or parameters.get("type", "object") != "object":
        raise DataError(f"{where}: must be a JSON schema of type 'object' with 'properties' (an object)")
    if learned is None:
        return parameters
    order, untrained = list(learned.get("properties", {})), learned.get(UNTRAINED, {})
    unknown = [key for key in properties if key not in order and key not in untrained]
    if unknown:
        raise DataError(
            f"{where}: {', '.join(map(repr, unknown))} not a parameter of the bank's tool '{name}' (it learned "
            f"{', '.join(map(repr, order)) or 'none'}); send a schema over those names, or leave 'parameters' out"
        )
    required = [key for key in parameters.get("required") or () if key in untrained]  # the client's to insist on
    return {**parameters, "properties": {key: properties[key] for key in [*order, *required] if key in properties}}


def reply_from(model: TokMemModel, tokens: list[int], plain: bool, turn: int) -> Reply:
    """The turn's tokens (up to EOS) as text (``Generation.text``: ``generate``'s) or as tool calls (ids
    ``call_<turn>_<k>``) when the turn starts with a tool row's memory token."""
    vocab, eos, tokenizer = model.vocab_size, model.backbone.eos_token_id, model.backbone.tokenizer
    finish = "stop" if tokens[-1] == eos else "length"
    tokens = model.without_context(tokens[:-1] if tokens[-1] == eos else tokens)
    if not tokens or not starts_calls(model, tokens[0], plain):
        return Reply(to_generation(model, "", tokens, 0.0, not plain).text, [], finish)
    starts = [k for k, token in enumerate(tokens) if token >= vocab]
    calls = []
    for k, (start, end) in enumerate(zip(starts, [*starts[1:], len(tokens)])):
        arguments = tokenizer.decode(tokens[start + 1 : end], skip_special_tokens=True).strip()
        calls.append(ToolCall(call_id(turn, k), model.bank.names[tokens[start] - vocab], arguments))
    return Reply(None, calls, "tool_calls" if finish == "stop" else finish)


def starts_calls(model: TokMemModel, first: int, plain: bool) -> bool:
    """Whether a turn whose first token is ``first`` answers with tool calls: it starts with a tool row's memory token."""
    return not plain and first >= model.vocab_size and model.bank.is_tool(first - model.vocab_size)


def call_id(turn: int, k: int) -> str:
    """The id of the ``k``-th tool call of the turn answering a conversation of ``turn`` messages."""
    return f"call_{turn}_{k}"
