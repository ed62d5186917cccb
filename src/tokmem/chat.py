"""The tool-calling loop: ``chat`` answers one assistant turn of an OpenAI-style conversation, with text or with tool
calls; ``run_tools`` runs the whole loop (call → the user's executor → result → next call or answer).

A conversation is laid out as training lays out a chain with results, by the same function
(``tokmem.sequences.turn_ids``): the messages up to the first tool calls through the chat template, then per
assistant turn with ``tool_calls`` each call's memory token and its arguments and EOS, then the ``role: "tool"``
results and the next assistant header (``Calls``).  So a bank trained on steps with results meets, at run time,
exactly the tokens it was trained on.  An answer in words after the results (its text, EOS: ``Answer``) may be
followed by the user's next turn (``UserTurns``) and more calls.

The model answers with tool calls when its turn starts with a tool row's memory token (the name comes from the
row, the arguments are what follows, under the tool's schema where the bank has one); several calls chain in one
turn; EOS ends the turn.  ``tool_choice`` (OpenAI's): ``"auto"`` routes as TokMem does (the open-set rule may
answer with text), ``"none"`` masks the tool rows, ``"required"`` forces the best tool row, ``{"type": "function",
"function": {"name": …}}`` forces that one call, once; ``tools`` (names or OpenAI tool objects) limits routing to those rows,
and a tool object's ``parameters`` bind its arguments instead of the bank's schema (``tool_schemas``).

A turn does not repeat itself: under ``tool_choice="auto"`` a call the conversation already answered since the
user's last message (the same tool, the same arguments) is dropped from the turn, and a turn of nothing but such
calls is decoded again without those tools' rows (``without_repeats``) — so a small model that would loop on its
favourite tool answers from the result instead; and under any ``tool_choice`` a call identical to an earlier one of the
same turn is dropped.  ``tokmem.chat`` and the server apply the same rule.

``ChatCache`` keeps the KV cache of the conversation between calls: each call encodes only the tokens after the
longest prefix it shares with what the cache holds (``prefilled`` says how many).
"""

from __future__ import annotations

import itertools
import json
from functools import partial
from dataclasses import dataclass, field, replace

import torch
from transformers import DynamicCache

from tokmem.batch import join_caches, left_pad
from tokmem.decode import DecodeConfig, contrasted_logits, decode_rows, to_generation
from tokmem.errors import DataError, cut, listed
from tokmem.training.sequences import (
    RESULT_TOKENS,
    Answer,
    Calls,
    CallContext,
    UserTurns,
    chat_prefix,
    shown_schema_ids,
    tool_call_ids,
    turn_ids,
)
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


@dataclass
class ChatCache:
    """The tokens of a conversation so far and their KV cache; ``prefilled``: positions the last call encoded."""

    ids: list[int] = field(default_factory=list)
    kv: DynamicCache | None = None
    prefilled: int = 0


@torch.no_grad()
def chat(
    model: TokMemModel,
    messages: list[dict],
    tools=None,
    tool_choice="auto",
    config: DecodeConfig | None = None,
    cache: ChatCache | None = None,
    result_tokens: int = RESULT_TOKENS,
) -> Reply:
    """The assistant's next turn: text, or tool calls.  ``cache``: reuse (and update) a conversation's KV cache."""
    ids = conversation_ids(model, messages, result_tokens)
    cache = cache if cache is not None else ChatCache()
    answered = [answered_calls(messages, tool_choice)]
    return _answer(model, [ids], [len(messages)], [cache], tools, tool_choice, config, answered)[0]


@torch.no_grad()
def chat_batch(
    model: TokMemModel,
    conversations: list[list[dict]],
    tools=None,
    tool_choice="auto",
    config: DecodeConfig | None = None,
    caches: list[ChatCache] | None = None,
    result_tokens: int = RESULT_TOKENS,
    avoid_repeats: bool | None = None,
) -> list[Reply]:
    """The next turn of several conversations, decoded together (``config.batch_size`` at a time; each its own
    schemas), as ``chat`` answers each alone.  ``tools`` and ``tool_choice`` apply to every one; ``caches``: one per
    conversation, reused and updated as ``chat``'s.  ``avoid_repeats``: a turn does not repeat a call answered since
    the user's last message (``answered_calls``) under ``"auto"`` only (None, as ``chat`` and the server), under
    every ``tool_choice`` (True: the tool-loop study's rule when asked for), or never (False).  A bad conversation is
    a ``DataError`` naming it."""
    caches = caches if caches is not None else [ChatCache() for _ in conversations]
    if len(caches) != len(conversations):
        raise ValueError(f"{len(conversations)} conversations but {len(caches)} caches")
    ids = [_conversation_ids(model, messages, result_tokens, k) for k, messages in enumerate(conversations)]
    size = (config or DecodeConfig()).batch_size
    return [
        reply
        for first in range(0, len(ids), size)
        for reply in _answer(
            model,
            ids[first : first + size],
            [len(messages) for messages in conversations[first : first + size]],
            caches[first : first + size],
            tools,
            tool_choice,
            config,
            [_not_repeated(messages, tool_choice, avoid_repeats) for messages in conversations[first : first + size]],
        )
    ]


def _not_repeated(messages: list[dict], tool_choice, avoid_repeats: bool | None) -> set[tuple[str, str]]:
    """The calls a turn may not repeat under ``chat_batch``'s ``avoid_repeats``."""
    if avoid_repeats is None:
        return answered_calls(messages, tool_choice)
    return answered_calls(messages, "auto") if avoid_repeats else set()


def _conversation_ids(model: TokMemModel, messages: list[dict], result_tokens: int, k: int) -> list[int]:
    try:
        return conversation_ids(model, messages, result_tokens)
    except DataError as error:
        raise DataError(f"conversations[{k}]: {error}") from None


def _answer(model, ids, turns, caches, tools, tool_choice, config, answered) -> list[Reply]:
    """Decode the next turn of conversations laid out as ``ids`` (``turns``: their numbers of messages) in one batch,
    each on what its cache holds; every cache is updated to its conversation and answer.  ``answered``: per
    conversation, the calls its turn may not repeat (``without_repeats``; a turn of repeats only is decoded again,
    those tools' rows masked)."""
    config = config or DecodeConfig()
    allowed, forced, threshold = tool_routing(model, tools, tool_choice, config.threshold)
    config = replace(config, threshold=threshold, references=False)  # results are in context: arguments are values
    if isinstance(tool_choice, dict):  # a named tool: that call, once (OpenAI's)
        config = replace(config, max_steps=1)
    allowed, schemas = allowed.expand(len(ids), -1).clone(), tool_schemas(model, tools)
    replies: list[Reply | None] = [None] * len(ids)
    pending = list(range(len(ids)))
    while pending:
        decoded = _decode(
            model, [ids[i] for i in pending], [caches[i] for i in pending], allowed[pending], forced, config, schemas
        )
        again = []
        for i, (tokens, plain) in zip(pending, decoded):
            reply, repeated = without_repeats(reply_from(model, tokens, plain, turns[i]), answered[i], turns[i])
            if repeated:
                allowed[i, [model.bank.row(name) for name in repeated]] = False
                again.append(i)
            replies[i] = reply
        pending = again
    return replies


def _decode(model, ids, caches, allowed, forced, config, schemas) -> list[tuple[list[int], bool]]:
    """(tokens up to EOS, whether the plain backbone answered) per conversation of ``ids``, decoded in one batch on
    what each cache holds; every cache is updated to its conversation and answer."""
    if model.bank.shows_schemas or config.context_contrast:
        return _decode_with_context(model, ids, caches, allowed, forced, config, schemas)
    return _decode_batch(model, ids, caches, allowed, forced, config, schemas)


def _decode_with_context(model, ids, caches, allowed, forced, config, schemas) -> list[tuple[list[int], bool]]:
    """``_decode`` for a bank whose tools' schemas are shown between their memory tokens and their arguments, in two
    passes: the first token (routing: a memory token, or the plain backbone's first word); then, after each
    chosen tool's memory token and its context (as training laid them out), its arguments, and for the plain rows
    their answer with the bank masked.  One call a turn: the arguments end the turn (a next call's context would have
    to be laid out too).  Under ``config.context_contrast`` the second pass decodes beside bare twins
    (``_decode_contrasted``)."""
    routed = _decode_batch(model, ids, caches, allowed, forced, replace(config, max_new_tokens=1), schemas)
    memory = [tokens[0] if starts_calls(model, tokens[0], plain) else -1 for tokens, plain in routed]
    plain_rows = torch.tensor([token < 0 for token in memory], device=allowed.device)
    allowed = allowed.masked_fill(plain_rows.unsqueeze(-1), False)  # the plain rows answer as the backbone again
    shown = [row + context_after(model, token) for row, token in zip(ids, memory)]
    begun = torch.tensor(memory, device=model.device)
    first_pass = [cache.prefilled for cache in caches]
    second = _decode_contrasted if config.context_contrast else _decode_batch
    decoded = second(model, shown, caches, allowed, -1, replace(config, max_steps=1), schemas, begun)
    for cache, prefilled in zip(caches, first_pass):
        cache.prefilled += prefilled  # the tokens both passes encoded
    return [
        (([token] if token >= 0 else []) + tokens, plain)
        for token, (tokens, _), (_, plain) in zip(memory, decoded, routed)
    ]


def _decode_contrasted(model, ids, caches, allowed, forced, config, schemas, begun) -> list[tuple[list[int], bool]]:
    """``_decode_batch`` with context-aware decoding (``decode.contrasted_logits``): beside each conversation, a
    twin of it without the conversation (an empty user message, then the same memory token and context) is fed the
    same tokens, and each token is picked from the two rows' logits contrasted.  Greedy only (a sampled twin could
    pick another token)."""
    if config.temperature > 0:
        raise ValueError("context_contrast decodes greedily: set temperature to 0")
    bare = conversation_ids(model, [{"role": "user", "content": ""}])
    twins = [bare + context_after(model, memory) for memory in begun.tolist()]
    check = partial(contrasted_logits, strength=config.context_contrast, active=begun >= 0)
    rows = len(ids)
    decoded = _decode_batch(
        model,
        ids + twins,
        caches + [ChatCache() for _ in twins],
        torch.cat([allowed, allowed]),
        forced,
        config,
        schemas,
        torch.cat([begun, begun]),
        check,
    )
    return decoded[:rows]


def context_after(model: TokMemModel, memory: int) -> list[int]:
    """The memory token of a tool and the context that follows it before its arguments: its tail, and its schema in a
    bank that shows schemas (``tool_call_ids``'s layout; the server's engine lays it out so too); nothing for
    ``memory`` -1 (no call)."""
    if memory < 0:
        return []
    schema = model.bank.schemas[memory - model.vocab_size] if model.bank.shows_schemas else None
    shown = [] if schema is None else shown_schema_ids(model.backbone.tokenizer, schema)
    return [memory, *model.tail_ids(memory), *shown]


def _decode_batch(
    model, ids, caches, allowed, forced, config, schemas, begun=None, check=None
) -> list[tuple[list[int], bool]]:
    """``_decode`` in one pass (``begun``, ``check``: see ``decode_rows``)."""
    new, mask, kv = _batch_cache(model, caches, ids)
    rows = len(ids)
    generator = torch.Generator(device=model.device).manual_seed(config.seed)
    answers, _, plain, kv, mask = decode_rows(
        model,
        new,
        mask,
        kv,
        config,
        torch.full((rows,), forced, device=model.device),
        generator,
        allowed,
        schemas,
        begun=begun,
        check=check,
    )
    decoded = []
    for i, (cache, tokens) in enumerate(zip(caches, answers)):
        tokens = _up_to_eos(tokens, model.backbone.eos_token_id)
        cache.ids, cache.kv = (ids[i] + tokens)[: int(mask[i].sum())], _row_cache(model, kv, mask[i], i)
        decoded.append((tokens, bool(plain[i])))
    return decoded


def _batch_cache(model, caches, ids) -> tuple[torch.Tensor, torch.Tensor, DynamicCache]:
    """(the tokens still to encode, left-padded; the attention mask over the cache and them; one KV cache): each
    conversation's reusable part (``_reuse``) joined (``batch.join_caches``).  Sets each cache's ``prefilled``."""
    reused = [_reuse(model, cache, row) for cache, row in zip(caches, ids)]
    for cache, (new, _) in zip(caches, reused):
        cache.prefilled = len(new)
    new, new_mask = left_pad([new for new, _ in reused], model.backbone.tokenizer.pad_token_id, model.device)
    held = [(kv, new_mask.new_ones(1, kv.get_seq_length())) for _, kv in reused]
    batch, mask = join_caches(held, into=DynamicCache(config=model.lm.config))
    return new, torch.cat([mask, new_mask], dim=-1), batch


def _row_cache(model: TokMemModel, kv: DynamicCache, mask: torch.Tensor, row: int) -> DynamicCache:
    """Row ``row`` of a batch's KV cache, without its padding (the columns ``mask`` zeroes)."""
    keep = mask.bool()
    cache = DynamicCache(config=model.lm.config)
    for layer, states in enumerate(kv.layers):
        cache.update(states.keys[row : row + 1, :, keep], states.values[row : row + 1, :, keep], layer)
    return cache


def _up_to_eos(tokens: list[int], eos: int) -> list[int]:
    """A batch row's tokens up to its first EOS (included): after it, the row only waited for the others."""
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def run_tools(
    model: TokMemModel, messages: list[dict], executor, tools=None, max_turns: int = 8, **options
) -> list[dict]:
    """Run the loop: ask, call ``executor(name, arguments: dict) -> str`` for each tool call, give back the results,
    until the model answers without calls (or after ``max_turns`` turns).  Returns the whole conversation; one
    KV cache serves every turn.  ``options``: as ``chat`` takes them."""
    messages, cache = list(messages), ChatCache()
    for _ in range(max_turns):
        reply = chat(model, messages, tools=tools, cache=cache, **options)
        messages.append(reply.message)
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": executor(call.name, _arguments(call))})
    return messages


def conversation_ids(model: TokMemModel, messages: list[dict], result_tokens: int = RESULT_TOKENS) -> list[int]:
    """The conversation's tokens up to where the assistant answers next (see the module's docstring).

    After the first tool calls the conversation may go on: more calls and their results, the assistant's answer
    in words (its text, then EOS, as decoding ends it), and the user's next messages (``UserTurns``)."""
    tokenizer = model.backbone.tokenizer
    first_call = next((i for i, m in enumerate(messages) if _calls(m)), len(messages))
    if first_call == 0:
        raise DataError(
            "messages[0]: the conversation must start with the messages the tool calls answer (a user turn)"
        )
    prefix = chat_prefix(tokenizer, [_text_message(m, i) for i, m in enumerate(messages[:first_call])])
    return prefix + turn_ids(tokenizer, _turns(model, messages, first_call), result_tokens)[0]


def _turns(model: TokMemModel, messages: list[dict], i: int) -> list:
    """The turns (``tokmem.sequences``: ``Calls``, ``Answer``, ``UserTurns``) of ``messages`` from ``i``, the first
    tool calls, on; a message out of place is a ``DataError`` naming it."""
    turns: list = []
    while i < len(messages):
        message, calls = messages[i], _calls(messages[i])
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


def _calls(message) -> list:
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
            f"{where}.function.name: {cut(repr(name))} is not a tool in the bank (its tools: "
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
        for call in _calls(message)
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


def tool_routing(model: TokMemModel, tools, tool_choice, threshold: float) -> tuple[torch.Tensor, int, float]:
    """(the bank rows the turn may use, the memory id forced first or -1, routing's threshold) for OpenAI's ``tools``
    and ``tool_choice``; ``threshold`` is the open-set rule's, 0 for ``"required"`` (it always routes, among the
    allowed tool rows).  Bad names are ``DataError``s naming the field (a server's 400).  ``tokmem.chat`` and the
    server (``tokmem.serve``) both map a request through here."""
    bank = model.bank
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
                f"tool_choice: {cut(repr(tool_choice))} is not 'auto', 'none', 'required' or one of the allowed tools"
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


def _reuse(model: TokMemModel, cache: ChatCache, ids: list[int]) -> tuple[list[int], DynamicCache]:
    """The tokens still to encode and the KV cache to encode them on: ``cache`` cut to the longest prefix its tokens
    share with ``ids`` (leaving at least the last token to encode, whose state starts the answer)."""
    shared = 0
    for a, b in zip(cache.ids, ids[:-1]):
        if a != b:
            break
        shared += 1
    kv = cache.kv if cache.kv is not None and shared else DynamicCache(config=model.lm.config)
    if shared:
        kv.crop(shared - kv.get_seq_length())  # transformers 5 crops by the (negative) number of tokens to drop
    return ids[shared:], kv


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


def _arguments(call: ToolCall) -> dict:
    """A call's arguments for the executor: the JSON object, or ``{}`` where the model wrote none."""
    try:
        arguments = json.loads(call.arguments)
    except ValueError:
        return {}
    return arguments if isinstance(arguments, dict) else {}
