"""The tool-calling loop: ``chat`` answers one assistant turn of an OpenAI-style conversation, with text or with tool
calls; ``run_tools`` runs the whole loop (call → the user's executor → result → next call or answer).

The conversation is laid out as training lays out a chain with results (``tokmem.decoding.conversation``), and the
turn follows OpenAI's tool rules (``tokmem.decoding.tool_rules``: ``tools``, ``tool_choice``, no repeated call),
as the server's turns do.

``ChatCache`` keeps the KV cache of the conversation between calls: each call encodes only the tokens after the
longest prefix it shares with what the cache holds (``prefilled`` says how many).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import partial

import torch
from transformers import DynamicCache

from tokmem.decoding.batch import join_caches, left_pad
from tokmem.decoding.conversation import context_after, conversation_ids
from tokmem.decoding.decode import DecodeConfig, contrasted_logits, decode_rows
from tokmem.decoding.tool_rules import (
    Reply,
    ToolCall,
    answered_calls,
    reply_from,
    starts_calls,
    tool_routing,
    tool_schemas,
    without_repeats,
)
from tokmem.errors import DataError
from tokmem.model import TokMemModel
from tokmem.training.sequences import RESULT_TOKENS


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


def _arguments(call: ToolCall) -> dict:
    """A call's arguments for the executor: the JSON object, or ``{}`` where the model wrote none."""
    try:
        arguments = json.loads(call.arguments)
    except ValueError:
        return {}
    return arguments if isinstance(arguments, dict) else {}
