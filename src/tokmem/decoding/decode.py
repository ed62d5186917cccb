"""Routing and generation with memory tokens.

After the query the model predicts over vocab ∪ bank.  If the memory tokens' total probability
(``memory_mass``) at that position is at least ``threshold``, the best memory token is appended
(routing) and its response segment is generated; after a segment the model may emit another memory
token (chaining, up to ``max_steps`` segments) or EOS.  Below the threshold the query does not match
any procedure and the model answers as the plain backbone (open set).

Queries are decoded in batches (left-padded) with one KV cache (``tokmem.decoding.batch.DecodeBatch``): ``prefill``
encodes the rows and picks their first tokens, ``step`` feeds one new token a row and picks the next.  They are the one
decoding loop's two halves: ``generate`` and ``tokmem.chat`` (through ``decode_rows``) and the server's engine run
them, each with its own stopping rules (``tokmem.decoding.stopping`` here; a served request's in
``serve.engine.Handle``).

After a tool row's memory token, where the bank keeps the tool's JSON schema, the arguments decode under it
(``tokmem.decoding.grammar``; ``DecodeConfig(schema=False)`` switches that off): each row its own grammar, the masks
applied as one tensor op; once a row's JSON closes only EOS or another memory token may follow.  A bank with tails
or shared rows has them fed after each memory token, one a step, before the arguments (``tokmem.bank.memory_ids``).

``complete`` continues contexts laid out elsewhere (rows before the query, a memory token before the
assistant header) with vocabulary tokens only: the studies that place the rows differently decode with it.
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass, field

import torch
import xgrammar
import xgrammar.contrib.hf
from transformers import DynamicCache

from tokmem.decoding.batch import DecodeBatch, left_pad
from tokmem.config import option
from tokmem.bank.memory_ids import ContextLayout
from tokmem.data.procedures import assemble_call
from tokmem.training.sequences import chat_prefix
from tokmem.model import TokMemModel, positions
from tokmem.decoding.stopping import BlankLineStop, EndOfSequence, stopped


OPEN_SET_THRESHOLD = 0.5  # the open-set rule's threshold where neither the caller nor the bank gives one


def open_set_threshold(bank, given: float | None = None) -> float:
    """The open-set threshold a decoding uses: ``given`` (the caller's), else the bank's own (``MemoryBank.threshold``,
    set by the training recipe that chose it), else ``OPEN_SET_THRESHOLD``."""
    if given is not None:
        return given
    return OPEN_SET_THRESHOLD if bank.threshold is None else bank.threshold


@dataclass
class DecodeConfig:
    max_new_tokens: int = option(128, "tokens an answer may generate")
    max_steps: int = option(4, "most segments (memory tokens) per answer")
    threshold: float | None = option(
        None,
        "open-set rule: the least memory mass at the routing position that routes (default: the bank's, else "
        f"{OPEN_SET_THRESHOLD})",
    )
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
    context_contrast: float = option(
        0.0,
        "tokmem.chat only, greedy: context-aware decoding of a call's arguments (contrasted_logits): each token is "
        "picked from (1 + a)·logits − a·logits without the conversation, a = this × the two's divergence (0 = off)",
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
    model.bank.refuse_shown_schemas("generate (chains written without results)")
    config = config or DecodeConfig()
    if config.context_contrast:
        raise ValueError("context_contrast: only tokmem.chat decodes with it (generate has no conversation to drop)")
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


def next_token_logits(logits, vocab, blocked):
    """``logits`` with the memory columns of ``blocked`` rows (open set, or at their segment limit) at -inf."""
    memory = torch.arange(logits.shape[-1], device=logits.device) >= vocab
    return logits.masked_fill(blocked.unsqueeze(-1) & memory, float("-inf"))


def next_tokens(logits, vocab, blocked, temperature, generator, top_p=None, generators=None) -> torch.Tensor:
    """The next token of each row (``pick``); ``blocked`` rows (open set, or at their segment limit) get no memory
    token."""
    return pick(next_token_logits(logits, vocab, blocked), temperature, generator, top_p, generators)


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
    stops = [BlankLineStop(model.backbone.tokenizer, model.vocab_size, ids.device)] if config.stop_at_blank_line else []
    rows, mass, plain, _, _ = decode_rows(model, ids, mask, cache, config, forced, generator, stops=stops)
    return [
        to_generation(model, q, row, float(m), not p)
        for q, row, m, p in zip(queries, rows, mass.tolist(), plain.tolist())
    ]


def decode_rows(
    model, ids, mask, cache, config, forced, generator, allowed=None, schemas=None, stops=(), begun=None, check=None
):
    """Encode ``ids`` (the new tokens of each row, after what ``cache`` holds; ``mask`` covers both) and decode each row
    until a stopping rule ends it (EOS, and ``stops``: objects of ``tokmem.decoding.stopping``) or
    ``config.max_new_tokens``: the rows' token lists (EOS included; a row done before the others is filled with EOS),
    their memory mass, which rows answer as the plain backbone, the cache (it holds every token fed, i.e. all but each
    row's last) and its attention mask (0 where a column is padding or fed after a row was done).

    ``forced``: per row a memory id to start with, or -1 (route).  ``allowed``: (rows, bank rows) bool, the memory
    tokens each row may use at all (default: every one); a row with none answers as the plain backbone.  ``schemas``:
    per bank row, the tool schema to decode under instead of the bank's (``argument_grammar``).  ``begun``: see
    ``Rules`` (``tokmem.chat``'s second pass for a bank that shows schemas); ``check``: see ``prefill``.
    """
    banks = Banks(*model.memory_matrices(), allowed, ContextLayout.of([model.bank], ids.device))
    full = lambda value: torch.full((len(ids),), value, device=ids.device)  # noqa: E731
    rules = Rules(
        full(open_set_threshold(model.bank, config.threshold)),
        forced,
        full(config.max_steps),
        full(config.temperature),
        full(1.0),
        begun,
    )
    grammar = argument_grammar(model, len(ids), config, schemas)
    batch, mass = prefill(model, ids, mask, cache, banks, rules, generator, grammar, check=check)
    stops = [EndOfSequence(model.backbone.eos_token_id), *stops]
    done = stopped(stops, batch.last)
    generated = [batch.last]
    for _ in range(config.max_new_tokens - 1):
        if done.all():
            break
        generated.append(step(model, batch, banks, generator, done=done, check=check))
        done |= stopped(stops, generated[-1])
    return torch.stack(generated, dim=1).tolist(), mass, batch.plain, batch.cache, batch.mask


@dataclass
class Banks:
    """The memory rows a batch decodes with: ``index`` and ``steer`` (bank rows, d), shared by every row, or (rows,
    widest bank, d), each row its own bank (the server); ``valid`` (rows, bank rows): the memory rows each row may use
    (None: every one; required with per-row banks, where it also marks their padding); ``context``: where the
    banks' context ids sit, forced after each memory token (None: no bank has any)."""

    index: torch.Tensor
    steer: torch.Tensor
    valid: torch.Tensor | None = None
    context: ContextLayout | None = None

    def routes(self, token: torch.Tensor, vocab: int) -> torch.Tensor:
        """Whether each row's token is a memory token that routes (a segment), not a context id."""
        return token >= vocab if self.context is None else self.context.routes(token, vocab)

    def forced_context(self, token: torch.Tensor, last: torch.Tensor, vocab: int) -> torch.Tensor:
        """``token`` where no context id must follow ``last`` (the token just fed), else that id."""
        if self.context is None:
            return token
        following = self.context.after(last, vocab)
        return torch.where(following >= 0, following, token)

    def logits(self, model: TokMemModel, hidden: torch.Tensor) -> torch.Tensor:
        """The logits over vocab ∪ bank at each row's last position (float), the memory rows a row may not use at -inf."""
        return model.logits(hidden[:, -1], self.index, self.valid).float()

    def any_usable(self, rows: int) -> torch.Tensor:
        """Per row, whether it has a memory row to use (a row with none answers as the plain backbone)."""
        if self.valid is not None:
            return self.valid.any(-1)
        return torch.full((rows,), self.index.shape[-2] > 0, device=self.index.device)


@dataclass
class Rules:
    """Per row (tensors, one value a row): the open-set rule's ``threshold``, a memory id ``forced`` first (-1:
    route), the most segments, the sampling rules (``pick``), and ``begun``: the memory id of a tool whose memory
    token and shown schema end the row's prompt, its arguments next (a bank that shows schemas), or -1 (None: none)."""

    threshold: torch.Tensor
    forced: torch.Tensor
    max_steps: torch.Tensor
    temperature: torch.Tensor
    top_p: torch.Tensor
    begun: torch.Tensor | None = None


def prefill(model, ids, mask, cache, banks: Banks, rules: Rules, generator, grammar=None, generators=None, check=None):
    """Encode ``ids`` (each row's new tokens after what ``cache`` holds; ``mask`` covers both) and pick each row's
    first answer token by the routing rule (``first_token_logits``; a whole-response ``grammar`` binds a text
    answer's first token): (the ``DecodeBatch`` whose ``last`` is that token, each row's memory mass).
    ``generators``: see ``pick``; ``check``: a hook that sees (and may change) the logits first (the server's
    guard against NaN, ``contrasted_logits``)."""
    position_ids = positions(mask)[:, mask.shape[1] - ids.shape[1] :]
    hidden, cache = model.hidden(ids, mask, position_ids, cache, banks.steer)
    logits = banks.logits(model, hidden)
    logits = logits if check is None else check(logits)
    usable = banks.any_usable(len(ids))
    begun = torch.full_like(rules.forced, -1) if rules.begun is None else rules.begun
    threshold = rules.threshold.masked_fill(begun >= 0, float("inf"))  # begun: no routing, vocabulary tokens first
    logits, plain, mass = first_token_logits(logits, model.vocab_size, threshold, usable, rules.forced)
    if grammar is not None:
        grammar.begin(begun.tolist())
        grammar.constrain(logits)
    token = pick(logits, rules.temperature, generator, rules.top_p, generators)
    if grammar is not None:
        grammar.routed(hidden[:, -1])
    steps = banks.routes(token, model.vocab_size).long() + (begun >= 0).long()  # a begun row's: its first segment
    state = [token, steps, plain & (begun < 0), rules.max_steps, rules.temperature, rules.top_p]
    return DecodeBatch(cache, mask, position_ids[:, -1] + 1, *state, grammar), mass


def step(model, batch: DecodeBatch, banks: Banks, generator, generators=None, done=None, check=None) -> torch.Tensor:
    """Feed each row's last token and pick its next one (the chaining rule: ``next_tokens``; the grammar's masks;
    after a memory token its context ids, ``Banks.forced_context``); ``batch`` moves on by one column.  ``done``: rows
    that have finished but stay in the batch (fed padding, masked, given EOS); ``generators``, ``check``: see
    ``prefill``."""
    fed, column = batch.last, torch.ones_like(batch.last)
    if done is not None:
        fed, column = fed.masked_fill(done, model.backbone.tokenizer.pad_token_id), (~done).long()
    mask = torch.cat([batch.mask, column.unsqueeze(-1)], dim=-1)
    hidden, batch.cache = model.hidden(fed.unsqueeze(-1), mask, batch.position.unsqueeze(-1), batch.cache, banks.steer)
    logits = banks.logits(model, hidden)
    logits = logits if check is None else check(logits)
    if batch.grammar is not None:
        batch.grammar.advance(batch.last)
        batch.grammar.constrain(logits)
    blocked = batch.plain | (batch.steps >= batch.max_steps)
    token = next_tokens(logits, model.vocab_size, blocked, batch.temperature, generator, batch.top_p, generators)
    if batch.grammar is not None:
        batch.grammar.routed(hidden[:, -1])
    token = banks.forced_context(token, batch.last, model.vocab_size)
    if done is not None:
        token = token.masked_fill(done, model.backbone.eos_token_id)
    batch.mask, batch.last, batch.position = mask, token, batch.position + 1
    batch.steps = batch.steps + banks.routes(token, model.vocab_size).long()
    return token


def contrasted_logits(logits: torch.Tensor, strength: float, active: torch.Tensor) -> torch.Tensor:
    """Context-aware decoding's logits, a ``check`` hook: the first half of the rows read their conversation, the
    second half are their twins without it (the same memory token and arguments so far after an empty user message).
    Each ``active`` row's logits become ``(1 + a)·own − a·twin``: what the conversation makes likelier than the tool's
    memory token alone does gains, what the memory token suggests by habit loses.  ``a`` is ``strength`` times the
    two rows' Jensen-Shannon divergence (in bits, 0..1) at that token (AdaCAD, Wang et al., 2024): where both
    predict the same (the rest of a word being copied), nothing changes; a fixed ``a`` (CAD, Shi et al., 2024)
    garbled the copies (``Portland`` → ``Portregon``).  The twin gets the same logits, so that greedy decoding feeds
    both the same token.  A column either row has at -inf (masked) keeps the row's own logit."""
    rows = len(logits) // 2
    own, twin = logits[:rows], logits[rows:]
    a = strength * _divergence(own, twin) * active
    mixed = torch.where(torch.isfinite(own) & torch.isfinite(twin), own + a.unsqueeze(-1) * (own - twin), own)
    return torch.cat([mixed, mixed])


def _divergence(own: torch.Tensor, twin: torch.Tensor) -> torch.Tensor:
    """Per row, the Jensen-Shannon divergence in bits (0..1) of the distributions of two rows of logits."""
    p, q = own.softmax(-1), twin.softmax(-1)
    m = (p + q) / 2
    kl = lambda x: torch.special.xlogy(x, x).sum(-1) - torch.special.xlogy(x, m).sum(-1)  # noqa: E731
    return ((kl(p) + kl(q)) / 2 / math.log(2)).clamp(0, 1)


def argument_grammar(model: TokMemModel, rows: int, config: DecodeConfig, schemas: list | None = None):
    """The ``ArgumentGrammar`` of a batch of ``rows``, or None when no tool row has a schema (or ``config.schema``
    is off): then nothing is constrained and the grammar backend is not even imported.  ``schemas``: per bank row,
    the schema to use instead of the bank's (a client's, ``tokmem.decoding.tool_rules.tool_schemas``); either is
    narrowed to the key set the bank's key-set rows choose (``tokmem.bank.key_sets``) where it admits it.  The schemas
    are compiled (or found compiled) here, before decoding starts; one that cannot be is a ``SchemaError`` naming it."""
    schemas = model.bank.schemas if schemas is None else schemas
    if not config.schema or not any(schema is not None for schema in schemas):
        return None
    from tokmem.decoding.grammar import ArgumentGrammar, grammars_for

    grammars = grammars_for(model.backbone.tokenizer, model.vocab_size)
    grammars = grammars.rows(schemas, config.references, key_sets=model.bank.key_sets)
    return ArgumentGrammar([grammars] * rows, model.vocab_size, model.backbone.eos_token_id)


def to_generation(model, query, row, mass, routed) -> Generation:
    """Split one generated row into (procedure, text) segments at its memory tokens, up to EOS.  A tool's
    segment is its generated arguments, returned as the whole call (``assemble_call``)."""
    vocab, eos, tokenizer, bank = model.vocab_size, model.backbone.eos_token_id, model.backbone.tokenizer, model.bank
    segments: list[tuple[int | None, list[int]]] = [] if routed else [(None, [])]
    for token in model.without_context(row):
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
def complete(
    model: TokMemModel,
    contexts: list[list[int]],
    config: DecodeConfig | None = None,
    grammar: xgrammar.CompiledGrammar | None = None,
) -> list[str]:
    """Continue each context (token ids over vocab ∪ bank) with vocabulary tokens up to EOS; the answers' text.

    The backbone's own ``generate`` runs on the embedded contexts, left-padded, with the bank's live
    rows.  The rows are inputs only: no memory token is generated.  Greedy unless
    ``config.temperature`` > 0; ``config.max_steps`` and ``threshold`` (routing) do not apply.  ``grammar`` (compiled
    over the backbone's vocabulary): every answer is text it accepts, from its first token (xgrammar's processor for
    ``generate``).
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
            logits_processor=[xgrammar.contrib.hf.LogitsProcessor(grammar)] if grammar is not None else None,
        )
        answers += [text.strip() for text in tokenizer.batch_decode(out, skip_special_tokens=True)]
    return answers
