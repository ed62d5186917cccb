"""Routing and generation with memory tokens.

After the query the model predicts over vocab ∪ bank.  If the memory tokens' total probability
(``memory_mass``) at that position is at least ``threshold``, the best memory token is appended
(routing) and its response segment is generated; after a segment the model may emit another memory
token (chaining, up to ``max_steps`` segments) or EOS.  Below the threshold the query does not match
any procedure and the model answers as the plain backbone (open set).

Queries are decoded in batches (left-padded) with one KV cache: every step feeds one new token.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from tokmem.layout import chat_prefix, positions
from tokmem.model import TokMemModel


@dataclass
class DecodeConfig:
    max_new_tokens: int = 128
    max_steps: int = 4  # segments (memory tokens) per answer
    threshold: float = 0.5  # open-set rule: minimum memory mass at the routing position
    temperature: float = 0.0  # 0 = greedy
    batch_size: int = 16
    seed: int = 0
    share_prefix: bool = False  # encode the tokens every prompt starts with once (prompts that repeat long instructions)


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


def _encode_shared_prefix(model: TokMemModel, prompts: list[list[int]]) -> DynamicCache | None:
    """The KV cache of the tokens every prompt starts with (leaving each at least one), or None if there are none.

    ``generate`` copies it into each batch (``DecodeConfig.share_prefix``), so prompts that repeat long
    instructions encode them once."""
    shared = os.path.commonprefix(prompts)[: min(map(len, prompts)) - 1]
    if not shared:
        return None
    ids = torch.tensor([shared], device=model.device)
    mask = torch.ones_like(ids)
    _, cache = model.hidden(ids, mask, positions(mask), DynamicCache(config=model.lm.config), model.memory_matrices()[1])
    return cache


def _left_pad(model: TokMemModel, queries: list[str]):
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


@torch.no_grad()
def route(model: TokMemModel, queries: list[str], k: int = 3, batch_size: int = 16) -> list[Route]:
    """The top-k procedures for each query, with probabilities renormalised over the memory tokens."""
    out = []
    vocab = model.vocab_size
    k = min(k, len(model.bank))
    index, steer = model.memory_matrices()
    for chunk in _batches(queries, batch_size):
        ids, mask = _left_pad(model, chunk)
        hidden, _ = model.hidden(ids, mask, positions(mask), steer=steer)
        probs = model.logits(hidden[:, -1], index).float().softmax(-1)
        mass = probs[:, vocab:].sum(-1)
        top = (probs[:, vocab:] / mass.unsqueeze(-1)).topk(k, dim=-1)
        for i, query in enumerate(chunk):
            names = [model.bank.names[r] for r in top.indices[i].tolist()]
            out.append(Route(query, list(zip(names, top.values[i].tolist())), float(mass[i])))
    return out


@torch.no_grad()
def generate(model: TokMemModel, queries: list[str], config: DecodeConfig | None = None, procedure: str | None = None) -> list[Generation]:
    """Answer each query (or chat conversation); ``procedure`` forces that memory token (routing skipped)."""
    config = config or DecodeConfig()
    generator = torch.Generator(device=model.device).manual_seed(config.seed)
    forced = None if procedure is None else model.memory_id(procedure)
    prompts = [chat_prefix(model.backbone.tokenizer, q) for q in queries]
    shared = _encode_shared_prefix(model, prompts) if config.share_prefix and prompts else None
    out = []
    for start in range(0, len(queries), config.batch_size):
        chunk = slice(start, start + config.batch_size)
        out += _generate_batch(model, queries[chunk], prompts[chunk], config, forced, generator, shared)
    return out


def _pick(logits: torch.Tensor, config: DecodeConfig, generator) -> torch.Tensor:
    if config.temperature <= 0:
        return logits.argmax(-1)
    probs = (logits.float() / config.temperature).softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _generate_batch(model, queries, prompts, config, forced, generator, shared) -> list[Generation]:
    """Decode one batch: ``prompts`` are the queries' token ids, ``shared`` the KV cache of a prefix they all start with."""
    vocab, eos = model.vocab_size, model.backbone.eos_token_id
    index, steer = model.memory_matrices()
    skip = 0 if shared is None else shared.get_seq_length()
    ids, mask = left_pad([p[skip:] for p in prompts], model.backbone.tokenizer.pad_token_id, model.device)
    cache = DynamicCache(config=model.lm.config)
    if shared is not None:
        cache = copy.deepcopy(shared)
        cache.batch_repeat_interleave(len(prompts))
        mask = torch.cat([mask.new_ones(len(prompts), skip), mask], dim=-1)
    position_ids = positions(mask)[:, skip:]
    hidden, cache = model.hidden(ids, mask, position_ids, cache, steer)
    logits = model.logits(hidden[:, -1], index).float()
    mass = logits.softmax(-1)[:, vocab:].sum(-1)

    if forced is not None:
        plain = torch.zeros(len(queries), dtype=torch.bool, device=ids.device)
        token = torch.full_like(plain, forced, dtype=torch.long)
    else:
        plain = (mass < config.threshold) | (len(model.bank) == 0)
        token = _pick(logits[:, :vocab], config, generator)
        if len(model.bank):
            token = torch.where(plain, token, _pick(logits[:, vocab:], config, generator) + vocab)

    steps = model.is_memory(token).long()
    done = token == eos
    generated = [token]
    for _ in range(config.max_new_tokens - 1):
        if done.all():
            break
        feed = token.masked_fill(done, model.backbone.tokenizer.pad_token_id)
        mask = torch.cat([mask, (~done).long().unsqueeze(-1)], dim=-1)
        position_ids = position_ids[:, -1:] + 1
        hidden, cache = model.hidden(feed.unsqueeze(-1), mask, position_ids, cache, steer)
        logits = model.logits(hidden[:, -1], index).float()
        logits[:, vocab:] = logits[:, vocab:].masked_fill((plain | (steps >= config.max_steps)).unsqueeze(-1), float("-inf"))
        token = _pick(logits, config, generator).masked_fill(done, eos)
        steps += model.is_memory(token).long()
        done |= token == eos
        generated.append(token)
    rows = torch.stack(generated, dim=1).tolist()
    return [_trace(model, q, row, float(m), not p) for q, row, m, p in zip(queries, rows, mass.tolist(), plain.tolist())]


def _trace(model, query, row, mass, routed) -> Generation:
    """Split one generated row into (procedure, text) segments at its memory tokens, up to EOS."""
    vocab, eos, tokenizer = model.vocab_size, model.backbone.eos_token_id, model.backbone.tokenizer
    segments: list[tuple[str | None, list[int]]] = [] if routed else [(None, [])]
    for token in row:
        if token == eos:
            break
        if token >= vocab:
            segments.append((model.bank.names[token - vocab], []))
        else:
            segments[-1][1].append(token)
    trace = [Segment(name, tokenizer.decode(ids, skip_special_tokens=True).strip()) for name, ids in segments]
    return Generation(query, trace, mass, routed)
