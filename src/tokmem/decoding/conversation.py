"""An OpenAI conversation laid out as token ids, as training lays out a chain with results.

One function lays out both (``tokmem.training.sequences.turn_ids``): the messages up to the first tool calls through
the chat template, then per assistant turn with ``tool_calls`` each call's memory token and its arguments and EOS,
then the ``role: "tool"`` results and the next assistant header (``Calls``).  So a bank trained on steps with results
meets, at run time, exactly the tokens it was trained on.  An answer in words after the results (its text, EOS:
``Answer``) may be followed by the user's next turn (``UserTurns``) and more calls.  A message out of place is a
``DataError`` naming it (a server's 400).
"""

from __future__ import annotations

import itertools
import json

from tokmem.errors import DataError, clipped, listed
from tokmem.model import TokMemModel
from tokmem.training.sequences import (
    RESULT_TOKENS,
    Answer,
    CallContext,
    Calls,
    UserTurns,
    chat_prefix,
    shown_schema_ids,
    tool_call_ids,
    turn_ids,
)


def conversation_ids(model: TokMemModel, messages: list[dict], result_tokens: int = RESULT_TOKENS) -> list[int]:
    """The conversation's tokens up to where the assistant answers next (see the module's docstring).

    After the first tool calls the conversation may go on: more calls and their results, the assistant's answer
    in words (its text, then EOS, as decoding ends it), and the user's next messages (``UserTurns``)."""
    tokenizer = model.backbone.tokenizer
    first_call = next((i for i, m in enumerate(messages) if assistant_calls(m)), len(messages))
    if first_call == 0:
        raise DataError(
            "messages[0]: the conversation must start with the messages the tool calls answer (a user turn)"
        )
    prefix = chat_prefix(tokenizer, [_text_message(m, i) for i, m in enumerate(messages[:first_call])])
    return prefix + turn_ids(tokenizer, _turns(model, messages, first_call), result_tokens)[0]


def _turns(model: TokMemModel, messages: list[dict], i: int) -> list:
    """The turns (``tokmem.training.sequences``: ``Calls``, ``Answer``, ``UserTurns``) of ``messages`` from ``i``, the first
    tool calls, on; a message out of place is a ``DataError`` naming it."""
    turns: list = []
    while i < len(messages):
        message, calls = messages[i], assistant_calls(messages[i])
        if turns and isinstance(turns[-1], Answer):  # the assistant's turn has ended in words: a user turn is next
            users = list(itertools.takewhile(lambda m: isinstance(m, dict) and m.get("role") == "user", messages[i:]))
            if not users:
                raise DataError(f"messages[{i}]: after the assistant's answer, a user turn must come next")
            turns.append(UserTurns([_text_message(m, i + k)["content"] for k, m in enumerate(users)]))
            i += len(users)
        elif calls:
            laid_out = [_call_ids(model, call, f"messages[{i}].tool_calls[{k}]") for k, call in enumerate(calls)]
            turns.append(Calls(laid_out, _results(messages, i + 1, [call.get("id") for call in calls])))
            i += 1 + len(calls)
        elif isinstance(message, dict) and message.get("role") == "assistant":
            if not isinstance(message.get("content") or "", str):
                raise DataError(f"messages[{i}].content: must be a string")
            turns.append(Answer(message.get("content") or ""))
            i += 1
        else:
            raise DataError(
                f"messages[{i}]: after tool results, the assistant answers (tool calls or words) before the next "
                "user turn; system messages and unanswered tool results cannot come here"
            )
    if turns and isinstance(turns[-1], Answer):
        raise DataError(f"messages[{len(messages) - 1}]: the conversation ends with the assistant's answer")
    return turns


def assistant_calls(message) -> list:
    """The tool calls of an assistant message (none for any other message)."""
    return (message.get("tool_calls") or []) if isinstance(message, dict) and message.get("role") == "assistant" else []


def _text_message(message, i: int) -> dict:
    if not isinstance(message, dict) or message.get("role") not in ("system", "developer", "user", "assistant"):
        raise DataError(
            f"messages[{i}]: expected a system, developer, user or assistant message (a 'tool' result must follow "
            "the assistant turn that called it)"
        )
    if not isinstance(message.get("content"), str):
        raise DataError(f"messages[{i}].content: must be a string")
    return {"role": message["role"], "content": message["content"]}


def _call_ids(model: TokMemModel, call, where: str) -> list[int] | CallContext:
    """A call as training lays it out: the tool row's memory token, then its arguments (compact, schema order).
    Arguments nested too deep for Python's JSON (a RecursionError) are a ``DataError`` naming them."""
    try:
        return _laid_out_call(model, call, where)
    except RecursionError:
        raise DataError(f"{where}.function.arguments: nested too deep") from None


def _laid_out_call(model: TokMemModel, call, where: str) -> list[int] | CallContext:
    function = call.get("function") if isinstance(call, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if name not in model.bank or not model.bank.is_tool(model.bank.row(name)):
        raise DataError(
            f"{where}.function.name: {clipped(repr(name))} is not a tool in the bank (its tools: "
            f"{listed(sorted(model.bank.tool_names())) or 'none'})"
        )
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except (TypeError, ValueError):
        arguments = None
    if not isinstance(arguments, dict):
        raise DataError(f"{where}.function.arguments: must be a JSON object as text")
    schema, memory = model.bank.schemas[model.bank.row(name)], model.memory_id(name)
    tokenizer = model.backbone.tokenizer
    return tool_call_ids(tokenizer, memory, arguments, schema, model.bank.shows_schemas, model.tail_ids(memory))


def _results(messages: list[dict], start: int, call_ids: list) -> list[str]:
    """The contents of the 'tool' messages from ``start`` that answer ``call_ids`` (one each, in any order)."""
    found = {}
    for i in range(start, min(start + len(call_ids), len(messages))):
        message = messages[i]
        if message.get("role") != "tool":
            break
        if not isinstance(message.get("content"), str):
            raise DataError(f"messages[{i}].content: a tool result must be a string")
        found[message.get("tool_call_id")] = message["content"]
    missing = [call_id for call_id in call_ids if call_id not in found]
    if missing:
        raise DataError(
            f"messages[{start - 1}]: no 'tool' message answers tool call(s) {', '.join(map(str, missing))} "
            "(each call's result must follow it, with its tool_call_id)"
        )
    return [found[call_id] for call_id in call_ids]


def context_after(model: TokMemModel, memory: int) -> list[int]:
    """The memory token of a tool and the context that follows it before its arguments: its tail, and its schema in a
    bank that shows schemas (``tool_call_ids``'s layout; the server's engine lays it out so too); nothing for
    ``memory`` -1 (no call)."""
    if memory < 0:
        return []
    schema = model.bank.schemas[memory - model.vocab_size] if model.bank.shows_schemas else None
    shown = [] if schema is None else shown_schema_ids(model.backbone.tokenizer, schema)
    return [memory, *model.tail_ids(memory), *shown]
