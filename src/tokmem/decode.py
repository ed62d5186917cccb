"""Routing and generation with memory tokens.

After the query the model predicts over vocab ∪ bank.  If the memory tokens' total probability
(``memory_mass``) at that position is at least ``threshold``, the best memory token is appended
(routing) and its response segment is generated; after a segment the model may emit another memory
token (chaining, up to ``max_steps`` segments) or EOS.  Below the threshold the query does not match
any procedure and the model answers as the plain backbone (open set).

Queries are decoded in batches (left-padded) with one KV cache: every step feeds one new token.

After a tool row's memory token, where the bank keeps the tool's JSON schema, the arguments decode under it
(``tokmem.grammar``; ``DecodeConfig(schema=False)`` switches that off): each row its own grammar, the masks
applied as one tensor op; once a row's JSON closes only EOS or another memory token may follow.

``complete`` continues contexts laid out elsewhere (rows before the query, a memory token before the
assistant header) with vocabulary tokens only: the studies that place the rows differently decode with it.
"""

from __future__ import annotations

import copy
import functools
import os
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from tokmem.config import option
from tokmem.data.procedures import assemble_call
from tokmem.sequences import chat_prefix, positions
from tokmem.model import TokMemModel


@dataclass
class DecodeConfig:
    max_new_tokens: int = option(128, "tokens an answer may generate")
    max_steps: int = option(4, "most segments (memory tokens) per answer")
    threshold: float = option(0.5, "open-set rule: the least memory mass at the routing position that routes")
    temperature: float = option(0.0, "0 = greedy")
    batch_size: int = option(16, "queries answered together")
    seed: int = option(0, "seed of the sampler (temperature > 0)")
    share_prefix: bool = option(
        False, "encode the tokens every prompt starts with once (prompts that repeat long instructions)"
    )
    stop_at_blank_line: bool = option(
        False, "end an answer at its first blank line after some text (prompted answers' separator)"
    )
    schema: bool = option(True, "decode a tool's arguments under its JSON schema, where the bank has one")
    references: bool = option(
        True,
        'let a schema-bound argument be a reference to an earlier call\'s result ("$var1.path$", the NESTFUL '
        "convention of chains written without results; tokmem.chat, which has results in context, never does)",
    )


@dataclass
class Segment:
    procedure: str | None  # None: the plain backbone's answer (open set)
    text: str


@dataclass
class Generation:
    query: str
    trace: list[Segment]
    memory_mass: float
    routed: bool = field(default=True)

    @property
    def text(self) -> str:
        return "\n".join(s.text for s in self.trace)

    @property
    def procedures(self) -> list[str]:
        return [s.procedure for s in self.trace if s.procedure is not None]


@dataclass
class Route:
    query: str
    candidates: list[tuple[str, float]]  # top-k (procedure, probability among memory tokens)
    memory_mass: float  # total probability of all memory tokens at the routing position

    @property
    def best(self) -> str | None:
        return self.candidates[0][0] if self.candidates else None


def _batches(items, size):
    for start in range(0, len(items), size):
        yield items[start : start + size]


@dataclass
class HeldPrefix:
    """The shared prefix (``DecodeConfig.share_prefix``) of a caller's last ``generate`` call and its KV cache, kept
    for the next call, which encodes only what its own shared prefix adds (native tool calling's prompts start with
    the same thousands of tokens of tool schemas at every step of the tool loop).  Only for a backbone whose weights
    do not change between the calls."""

    ids: list[int] = field(default_factory=list)
    cache: DynamicCache | None = None


def _encode_shared_prefix(model: TokMemModel, prompts: list[list[int]], held: HeldPrefix | None) -> DynamicCache | None:
    """The KV cache of the tokens every prompt starts with (leaving each at least one), or None if there are none.

    ``generate`` copies it into each batch (``DecodeConfig.share_prefix``), so prompts that repeat long
    instructions encode them once; with ``held``, the part it shares with the last call's is not encoded again."""
    shared = os.path.commonprefix(prompts)[: min(map(len, prompts)) - 1]
    if not shared:
        return None
    if held is None:
        return model.prefix_cache(torch.tensor([shared], device=model.device))
    reused = len(os.path.commonprefix([held.ids, shared]))
    if reused == len(shared) == len(held.ids):
        return held.cache
    if not reused:
        held.cache = DynamicCache(config=model.lm.config)
    elif reused < len(held.ids):  # in place: batches decode on copies of it
        held.cache.crop(reused - len(held.ids))  # transformers 5 crops by the (negative) number of tokens to drop
    if reused < len(shared):
        mask = torch.ones(1, len(shared), dtype=torch.long, device=model.device)
        new = torch.tensor([shared[reused:]], device=model.device)
        held.cache = model.hidden(new, mask, positions(mask)[:, reused:], held.cache)[1]
    held.ids = shared
    return held.cache


def pad_queries(model: TokMemModel, queries: list[str]):
    tokenizer = model.backbone.tokenizer
    return left_pad([chat_prefix(tokenizer, q) for q in queries], tokenizer.pad_token_id, model.device)


def left_pad(prefixes: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask) of token lists padded on the left to one width."""
    width = max(map(len, prefixes))
    ids = torch.full((len(prefixes), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prefixes):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    return ids.to(device), mask.to(device)


def left_pad_columns(states: torch.Tensor, width: int) -> torch.Tensor:
    """Left-pad cached keys or values (batch, heads, columns, head dim) to ``width`` columns."""
    return torch.nn.functional.pad(states, (0, 0, width - states.shape[2], 0))


@torch.no_grad()
def route(model: TokMemModel, queries: list[str], k: int = 3, batch_size: int = 16) -> list[Route]:
    """The top-k procedures for each query, with probabilities renormalised over the memory tokens."""
    out = []
    vocab = model.vocab_size
    k = min(k, len(model.bank))
    index, steer = model.memory_matrices()
    for chunk in _batches(queries, batch_size):
        ids, mask = pad_queries(model, chunk)
        hidden, _ = model.hidden(ids, mask, positions(mask), steer=steer)
        probs = model.logits(hidden[:, -1], index).float().softmax(-1)
        mass = probs[:, vocab:].sum(-1)
        top = (probs[:, vocab:] / mass.unsqueeze(-1)).topk(k, dim=-1)
        for i, query in enumerate(chunk):
            names = [model.bank.names[r] for r in top.indices[i].tolist()]
            out.append(Route(query, list(zip(names, top.values[i].tolist())), float(mass[i])))
    return out


@torch.no_grad()
def generate(
    model: TokMemModel,
    queries: list,
    config: DecodeConfig | None = None,
    procedure: str | None = None,
    held: HeldPrefix | None = None,
) -> list[Generation]:
    """Answer each query (or chat conversation, or prompt the caller laid out itself as token ids: a chat template's
    tools, native tool calling); ``procedure`` forces that memory token (routing skipped); ``held``: the shared
    prefix kept from the caller's last call (``HeldPrefix``)."""
    config = config or DecodeConfig()
    generator = torch.Generator(device=model.device).manual_seed(config.seed)
    forced = None if procedure is None else model.memory_id(procedure)
    prompts = [q if _laid_out(q) else chat_prefix(model.backbone.tokenizer, q) for q in queries]
    shared = _encode_shared_prefix(model, prompts, held) if config.share_prefix and prompts else None
    out = []
    for start in range(0, len(queries), config.batch_size):
        chunk = slice(start, start + config.batch_size)
        out += _generate_batch(model, queries[chunk], prompts[chunk], config, forced, generator, shared)
    return out


def _laid_out(query) -> bool:
    """Whether a query is a prompt already laid out as token ids."""
    return isinstance(query, list) and bool(query) and isinstance(query[0], int)


def pick(logits: torch.Tensor, temperature, generator, top_p=None, generators=None) -> torch.Tensor:
    """One token per row: greedy where the temperature is 0, else sampled (``temperature``: a number or one per row),
    from each row's nucleus where ``top_p`` (a number or one per row) is below 1.  ``generators``: {row: its own
    ``torch.Generator``} for rows that sample reproducibly whatever the batch (a served request's ``seed``; one draw
    per row, as vLLM does); the other rows draw from ``generator``."""
    temperature = torch.as_tensor(temperature, dtype=torch.float, device=logits.device)
    greedy = logits.argmax(-1)
    sampled_rows = temperature > 0
    if not sampled_rows.any():
        return greedy
    scale = torch.where(sampled_rows, temperature, 1.0).unsqueeze(-1)
    shifted = logits.float() - logits.float().amax(-1, keepdim=True)  # <= 0: a small temperature cannot overflow it
    probs = (shifted / scale).softmax(-1)
    if top_p is not None:
        probs = nucleus(probs, top_p)
    sampled = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    for row, own in (generators or {}).items():
        sampled[row] = torch.multinomial(probs[row], 1, generator=own)[0]
    return torch.where(sampled_rows, sampled, greedy)


def nucleus(probs: torch.Tensor, top_p) -> torch.Tensor:
    """``probs`` with each row's tokens outside its nucleus at 0: the most probable tokens whose probability first
    reaches ``top_p`` (a number or one per row) are kept."""
    top_p = torch.as_tensor(top_p, dtype=probs.dtype, device=probs.device).reshape(-1, 1)
    if not (top_p < 1).any():
        return probs
    ordered, order = probs.sort(-1, descending=True)
    kept = (ordered.cumsum(-1) - ordered) < top_p  # the mass of the more probable tokens is still short of top_p
    return probs * torch.zeros_like(kept).scatter(-1, order, kept)


def first_token_logits(logits, vocab, threshold, has_rows, forced):
    """The routing rule at the first answer position as a mask: (logits, plain, memory mass).

    ``logits`` are over vocab ∪ bank, with the memory columns a row's bank lacks at -inf.  A row whose
    memory mass (before any temperature) is below its ``threshold``, or whose bank is empty (``has_rows``
    false), answers as the plain backbone (open set: its memory columns go to -inf); the others start with
    a memory token (their vocabulary columns go to -inf), or with ``forced`` where it is a memory id (>= 0;
    routing skipped: every other column goes to -inf).  ``tokmem.vllm`` applies the same rule.
    """
    mass = logits.softmax(-1)[:, vocab:].sum(-1)
    routing = forced < 0
    plain = ((mass < threshold) | ~has_rows) & routing
    columns = torch.arange(logits.shape[-1], device=logits.device)
    allowed = torch.where(
        routing.unsqueeze(-1), (columns >= vocab) != plain.unsqueeze(-1), columns == forced.unsqueeze(-1)
    )
    return logits.masked_fill(~allowed, float("-inf")), plain, mass


def first_tokens(logits, vocab, threshold, has_rows, forced, temperature, generator):
    """The first answer token of each row at the routing position: (token, plain, memory mass); see ``first_token_logits``."""
    allowed, plain, mass = first_token_logits(logits, vocab, threshold, has_rows, forced)
    return pick(allowed, temperature, generator), plain, mass


def next_token_logits(logits, vocab, blocked):
    """``logits`` with the memory columns of ``blocked`` rows (open set, or at their segment limit) at -inf."""
    memory = torch.arange(logits.shape[-1], device=logits.device) >= vocab
    return logits.masked_fill(blocked.unsqueeze(-1) & memory, float("-inf"))


def next_tokens(logits, vocab, blocked, temperature, generator, top_p=None, generators=None) -> torch.Tensor:
    """The next token of each row (``pick``); ``blocked`` rows (open set, or at their segment limit) get no memory
    token."""
    return pick(next_token_logits(logits, vocab, blocked), temperature, generator, top_p, generators)


class BlankLineStop:
    """Finds the rows whose text has reached a blank line (``"\n\n"``) after its first non-blank character.

    Prompted baselines separate requests with a blank line and keep an answer's text up to it (``first_block``),
    so decoding a row further is wasted work.  A blank line lies within one token or across two (one ending,
    the next starting with a newline); the tables say which tokens do what, over the vocabulary's texts.
    """

    def __init__(self, tokenizer, vocab: int, device):
        self.vocab = vocab
        self.tables = [table.to(device) for table in _newline_tables(tokenizer, vocab)]
        self.started = self.after_newline = None  # per row: some text seen; the text so far ends with a newline

    def update(self, token: torch.Tensor) -> torch.Tensor:
        """Feed each row's new token; True for the rows whose text now has a blank line after some text."""
        is_text = token < self.vocab  # memory tokens are no text
        t = token.clamp(max=self.vocab - 1)
        blank, blank_after_text, has_text, ends, starts = (table[t] & is_text for table in self.tables)
        if self.started is None:
            self.started, self.after_newline = torch.zeros_like(is_text), torch.zeros_like(is_text)
        stop = torch.where(self.started, blank | (self.after_newline & starts), blank_after_text)
        self.started = self.started | has_text
        self.after_newline = torch.where(is_text, ends, self.after_newline)
        return stop


@functools.lru_cache(maxsize=4)
def _newline_tables(tokenizer, vocab: int) -> tuple[torch.Tensor, ...]:
    """Per token: has a blank line; has one after its first non-blank character; has a non-blank character;
    ends with a newline; starts with one."""
    texts = [tokenizer.decode([i]) for i in range(vocab)]
    rows = [("\n\n" in t, "\n\n" in t.lstrip(), bool(t.strip()), t.endswith("\n"), t.startswith("\n")) for t in texts]
    return tuple(torch.tensor(column, dtype=torch.bool) for column in zip(*rows))


def _generate_batch(model, queries, prompts, config, forced, generator, shared) -> list[Generation]:
    """Decode one batch: ``prompts`` are the queries' token ids, ``shared`` the KV cache of a prefix they all start with."""
    skip = 0 if shared is None else shared.get_seq_length()
    ids, mask = left_pad([p[skip:] for p in prompts], model.backbone.tokenizer.pad_token_id, model.device)
    cache = DynamicCache(config=model.lm.config)
    if shared is not None:
        cache = copy.deepcopy(shared)
        cache.batch_repeat_interleave(len(prompts))
        mask = torch.cat([mask.new_ones(len(prompts), skip), mask], dim=-1)
    forced = torch.full((len(queries),), -1 if forced is None else forced, device=ids.device)
    rows, mass, plain, _, _ = decode_rows(model, ids, mask, cache, config, forced, generator)
    return [
        to_generation(model, q, row, float(m), not p)
        for q, row, m, p in zip(queries, rows, mass.tolist(), plain.tolist())
    ]


def decode_rows(model, ids, mask, cache, config, forced, generator, allowed=None, schemas=None):
    """Encode ``ids`` (the new tokens of each row, after what ``cache`` holds; ``mask`` covers both) and decode each row
    up to EOS or ``config.max_new_tokens``: the rows' token lists (EOS included; a row done before the others is
    filled with EOS), their memory mass, which rows answer as the plain backbone, the cache (it holds every token
    fed, i.e. all but each row's last) and its attention mask (0 where a column is padding or fed after a row was done).

    ``forced``: per row a memory id to start with, or -1 (route).  ``allowed``: (rows, bank rows) bool, the memory
    tokens each row may use at all (default: every one); a row with none answers as the plain backbone.  ``schemas``:
    per bank row, the tool schema to decode under instead of the bank's (``argument_grammar``).
    """
    vocab, eos = model.vocab_size, model.backbone.eos_token_id
    index, steer = model.memory_matrices()
    position_ids = positions(mask)[:, mask.shape[1] - ids.shape[1] :]
    hidden, cache = model.hidden(ids, mask, position_ids, cache, steer)
    logits = _only(model.logits(hidden[:, -1], index).float(), allowed, vocab)
    rows = len(ids)
    has_rows = torch.full((rows,), len(model.bank) > 0, device=ids.device) if allowed is None else allowed.any(-1)
    token, plain, mass = first_tokens(logits, vocab, config.threshold, has_rows, forced, config.temperature, generator)

    steps = model.is_memory(token).long()
    grammar = argument_grammar(model, rows, config, schemas)
    stop = BlankLineStop(model.backbone.tokenizer, vocab, ids.device) if config.stop_at_blank_line else None
    done = (token == eos) | (stop.update(token) if stop else False)
    generated = [token]
    for _ in range(config.max_new_tokens - 1):
        if done.all():
            break
        feed = token.masked_fill(done, model.backbone.tokenizer.pad_token_id)
        mask = torch.cat([mask, (~done).long().unsqueeze(-1)], dim=-1)
        position_ids = position_ids[:, -1:] + 1
        hidden, cache = model.hidden(feed.unsqueeze(-1), mask, position_ids, cache, steer)
        logits = _only(model.logits(hidden[:, -1], index).float(), allowed, vocab)
        if grammar is not None:
            grammar.advance(token)
            grammar.constrain(logits)
        blocked = plain | (steps >= config.max_steps)
        token = next_tokens(logits, vocab, blocked, config.temperature, generator).masked_fill(done, eos)
        steps += model.is_memory(token).long()
        generated.append(token)
        done |= (token == eos) | (stop.update(token) if stop else False)
    return torch.stack(generated, dim=1).tolist(), mass, plain, cache, mask


def _only(logits: torch.Tensor, allowed: torch.Tensor | None, vocab: int) -> torch.Tensor:
    """``logits`` with the memory tokens a row may not use at -inf (in place)."""
    if allowed is not None:
        logits[:, vocab:] = logits[:, vocab:].masked_fill(~allowed, float("-inf"))
    return logits


def argument_grammar(model: TokMemModel, rows: int, config: DecodeConfig, schemas: list | None = None):
    """The ``ArgumentGrammar`` of a batch of ``rows``, or None when no tool row has a schema (or ``config.schema``
    is off): then nothing is constrained and the grammar backend is not even imported.  ``schemas``: per bank row,
    the schema to use instead of the bank's (a client's, ``tokmem.chat.tool_schemas``).  The schemas are compiled (or
    found compiled) here, before decoding starts; one that cannot be is a ``SchemaError`` naming it."""
    schemas = model.bank.schemas if schemas is None else schemas
    if not config.schema or not any(schema is not None for schema in schemas):
        return None
    from tokmem.grammar import ArgumentGrammar, grammars_for

    grammars = grammars_for(model.backbone.tokenizer, model.vocab_size).rows(schemas, config.references)
    return ArgumentGrammar([grammars] * rows, model.vocab_size, model.backbone.eos_token_id)


def to_generation(model, query, row, mass, routed) -> Generation:
    """Split one generated row into (procedure, text) segments at its memory tokens, up to EOS.  A tool's
    segment is its generated arguments, returned as the whole call (``assemble_call``)."""
    vocab, eos, tokenizer, bank = model.vocab_size, model.backbone.eos_token_id, model.backbone.tokenizer, model.bank
    segments: list[tuple[int | None, list[int]]] = [] if routed else [(None, [])]
    for token in row:
        if token == eos:
            break
        if token >= vocab:
            segments.append((token - vocab, []))
        else:
            segments[-1][1].append(token)
    trace = []
    for row_id, ids in segments:
        text = tokenizer.decode(ids, skip_special_tokens=True).strip()
        name = None if row_id is None else bank.names[row_id]
        trace.append(Segment(name, assemble_call(name, text) if name is not None and bank.is_tool(row_id) else text))
    return Generation(query, trace, mass, routed)


@torch.no_grad()
def complete(model: TokMemModel, contexts: list[list[int]], config: DecodeConfig | None = None) -> list[str]:
    """Continue each context (token ids over vocab ∪ bank) with vocabulary tokens up to EOS; the answers' text.

    The backbone's own ``generate`` runs on the embedded contexts, left-padded, with the bank's live
    rows.  The rows are inputs only: no memory token is generated.  Greedy unless
    ``config.temperature`` > 0; ``config.max_steps`` and ``threshold`` (routing) do not apply.
    """
    config = config or DecodeConfig()
    tokenizer = model.backbone.tokenizer
    torch.manual_seed(config.seed)
    sample = config.temperature > 0
    answers = []
    for chunk in _batches(contexts, config.batch_size):
        padded = tokenizer.pad({"input_ids": chunk}, padding=True, padding_side="left", return_tensors="pt")
        out = model.lm.generate(
            inputs_embeds=model.embed(padded["input_ids"].to(model.device)),
            attention_mask=padded["attention_mask"].to(model.device),
            max_new_tokens=config.max_new_tokens,
            do_sample=sample,
            temperature=config.temperature if sample else None,
            top_p=None,
            top_k=None,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        answers += [text.strip() for text in tokenizer.batch_decode(out, skip_special_tokens=True)]
    return answers
