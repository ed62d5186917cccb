"""The training loss: the next-token loss over the labelled tokens of a batch, back-propagating only what it needs.

``batch_loss`` takes the vocabulary's logits only where a label is.  Where nothing before the first label trains (a
frozen backbone, no memory token in the query) it takes one of two passes:

* ``suffix_hidden``: the query prefixes run without gradients (the ids every row starts with once for the batch;
  kept across epochs in a ``PrefixStore``), the labelled suffixes with gradients on top of them, packed in one row
  without their padding where that saves work (``_packing_pays``).
* ``segment_hidden`` (``TrainConfig.segment_backprop``): the whole record once without gradients, then each labelled
  segment alone with gradients, attending to the detached states before it.

``model`` is the ``TokMemModel`` whose loss is taken (its ``hidden`` pass, memory ids and prefix cache).  Each pass
returns the hidden states that predict the labelled tokens and those labels (right-padded), the same states as
one whole pass would give (``segment_hidden``: exact with one segment a record).
"""

from __future__ import annotations

import functools
import re

import torch
from torch import nn
from transformers import DynamicCache

from tokmem.model import positions
from tokmem.training import distributed
from tokmem.training.prefix_store import PrefixStore
from tokmem.training.sequences import ANSWER, IGNORE

NEXT_KEY, CLOSE = 1, 2  # ``key_choice_kinds``: a token that goes on to another key, one that closes the object
_NEXT_KEY, _CLOSE = re.compile(r'\s*"?,"\s*'), re.compile(r'\s*"?}\s*')


def batch_loss(
    model,
    batch: dict,
    prefixes: PrefixStore | None = None,
    segments: bool = False,
    choice_weight: float = 1.0,
    route_weight: float = 1.0,
) -> tuple[torch.Tensor, int]:
    """Mean next-token loss over labelled positions only (memory, response and EOS tokens), each label's times
    its weight (``label_weights``: ``choice_weight`` where a call decides its key set, ``route_weight`` at a
    memory token, 1 elsewhere), and the number of labels.

    With a frozen backbone the query prefix does not depend on the bank (the first memory token comes after it), so
    it runs without gradients (once a run with ``prefixes``) and only the labelled suffix is back-propagated
    (``suffix_hidden``); with ``segments``, only each labelled segment on its own (an approximation,
    ``segment_hidden``).
    """
    index, steer = model.memory_matrices()
    labels = batch["labels"]
    starts = (labels != IGNORE).int().argmax(-1)
    if prefix_is_fixed(model, batch["input_ids"], starts):
        labelled = segment_hidden if segments else suffix_hidden
        hidden, labels = labelled(model, batch, starts, steer, prefixes)
    else:
        hidden, _ = model.hidden(batch["input_ids"], batch["attention_mask"], steer=steer)
        hidden, labels = hidden[:, :-1], labels[:, 1:]
    where = labels != IGNORE
    weighted = (choice_weight, route_weight) != (1, 1)
    weights = label_weights(model, labels, choice_weight, route_weight)[where] if weighted else None
    logits = model.logits(hidden[where], index)
    return next_token_loss(logits.float(), labels[where], model.vocab_size, weights), int(where.sum())


def next_token_loss(
    logits: torch.Tensor, labels: torch.Tensor, vocab_size: int, weights: torch.Tensor | None = None
) -> torch.Tensor:
    """Mean cross-entropy of ``labels`` under ``logits`` (over vocab ∪ bank), each label's times its weight where
    ``weights`` are given; at an ``ANSWER`` label the target is every vocabulary token together, -log P(vocabulary):
    the answer in words, not which words."""
    answer = labels == ANSWER
    if not answer.any() and weights is None:
        return nn.functional.cross_entropy(logits, labels)
    target = logits.gather(1, labels.clamp(min=0).unsqueeze(1)).squeeze(1)
    target = target.masked_scatter(answer, logits[answer, :vocab_size].logsumexp(-1))
    losses = logits.logsumexp(-1) - target
    return (losses if weights is None else losses * weights).mean()


def label_weights(model, labels: torch.Tensor, choice_weight: float, route_weight: float) -> torch.Tensor:
    """Each label's (batch, positions) weight in the loss: ``route_weight`` at a memory token (the routing: one
    label a call), ``choice_weight`` where a call decides its key set (``key_choice_weights``), 1 elsewhere."""
    routes = 1 + (route_weight - 1) * (labels >= model.vocab_size).float()
    return routes * key_choice_weights(model, labels, choice_weight)


def key_choice_weights(model, labels: torch.Tensor, weight: float) -> torch.Tensor:
    """``weight`` at the labels (batch, positions) where a call decides which keys it carries, 1 elsewhere: a
    value's end that goes on to another key or closes the object (``key_choice_kinds``), and the label after one that
    goes on (the next key's first token: which key).  The few tokens of a call that decide its key set, among the
    dozens that copy its values."""
    vocab = model.vocab_size
    kinds = _key_choice_kinds_on(model.backbone.tokenizer, vocab, labels.device)
    words = (labels >= 0) & (labels < vocab)
    kinds = torch.where(words, kinds[labels.clamp(0, vocab - 1)], 0)
    after_next_key = nn.functional.pad(kinds[:, :-1] == NEXT_KEY, (1, 0)) & (labels != IGNORE)
    choice = (kinds == NEXT_KEY) | (kinds == CLOSE) | after_next_key
    return 1 + (weight - 1) * choice.float()


def key_choice_kinds(tokenizer, size: int) -> torch.Tensor:
    """For each of ``size`` ids, where a call's compact JSON arguments decide their key set: ``NEXT_KEY`` for a token
    that ends a value and goes on to another key (``","``, ``,"``), ``CLOSE`` for one that ends the object (``"}``,
    ``}``), 0 for any other (a comma inside a string is a token of its own, 0).  Read off the tokens' text, so it
    holds for any tokenizer that writes JSON's punctuation so."""
    texts = tokenizer.batch_decode([[i] for i in range(min(size, len(tokenizer)))])
    kinds = [NEXT_KEY if _NEXT_KEY.fullmatch(t) else CLOSE if _CLOSE.fullmatch(t) else 0 for t in texts]
    return torch.tensor(kinds + [0] * (size - len(kinds)), dtype=torch.long)


@functools.lru_cache(maxsize=4)
def _key_choice_kinds_on(tokenizer, size: int, device: torch.device) -> torch.Tensor:
    """``key_choice_kinds`` on ``device``, worked out once a run."""
    return key_choice_kinds(tokenizer, size).to(device)


def prefix_is_fixed(model, ids: torch.Tensor, starts: torch.Tensor) -> bool:
    """Whether nothing before the first label trains: no backbone weight (LoRA) and no memory token
    (prefix tuning puts its rows there)."""
    if any(p.requires_grad for p in model.lm.parameters()):
        return False
    in_prefix = torch.arange(ids.shape[1], device=ids.device) < starts.unsqueeze(-1)
    memory_in_prefix = (model.is_memory(ids) & in_prefix).any()
    fixed = ~memory_in_prefix & (starts.min() > 0)
    return distributed.all_ranks(fixed) if distributed.layers_sharded(model.lm) else bool(fixed)  # one host sync


def suffix_hidden(model, batch: dict, starts: torch.Tensor, steer: torch.Tensor, prefixes: PrefixStore | None):
    """Hidden states that predict each suffix token, and the suffix labels (right-padded).

    The query prefixes come as a KV cache computed without gradients (``_encode_prefixes``, or kept in
    ``prefixes`` from an earlier epoch); the suffixes (from the first labelled token on) run on top of it with
    gradients.  The state predicting the first suffix token is the prefix's last one.
    """
    hidden, labels, _ = _suffix_pass(model, batch, starts, steer, prefixes, packable=True)
    return hidden, labels


def _packed_suffix(model, suffix, real, starts, cache, mask, steer) -> torch.Tensor:
    """The suffixes' hidden states (right-padded as ``suffix``), computed in one row without their padding: the
    real suffix tokens side by side, each attending to its own row's prefix states (``cache``'s real columns,
    packed the same way) and to its own suffix up to itself (a block mask), at its own positions.  The same
    states as the padded pass (the padding was masked there), for the positions a batch really has: on SNI
    sequences half of a padded batch's suffix positions are padding."""
    rows = torch.arange(len(suffix), device=suffix.device)
    query_row, key_row = rows.unsqueeze(-1).expand_as(suffix)[real], rows.unsqueeze(-1).expand_as(mask)[mask.bool()]
    query_column = torch.arange(suffix.shape[1], device=suffix.device).expand_as(suffix)[real]
    packed = DynamicCache(config=model.lm.config)
    for layer, states in enumerate(cache.layers):  # (batch, heads, keys, d) -> (1, heads, real keys, d)
        keys, values = (
            t.transpose(1, 2)[mask.bool()].transpose(0, 1).unsqueeze(0) for t in (states.keys, states.values)
        )
        packed.update(keys, values, layer)
    same_row = query_row.unsqueeze(-1) == query_row
    allowed = torch.cat(
        [query_row.unsqueeze(-1) == key_row, same_row & (query_column <= query_column.unsqueeze(-1))], dim=-1
    )
    position_ids = (starts[query_row] + query_column).unsqueeze(0)
    hidden, _ = model.hidden(
        suffix[real].unsqueeze(0), _attention_mask(model, allowed.unsqueeze(0)), position_ids, packed, steer
    )
    return hidden.new_zeros(*suffix.shape, hidden.shape[-1]).masked_scatter(real.unsqueeze(-1), hidden[0])


def _prefix_states(model, batch: dict, starts: torch.Tensor, steer: torch.Tensor, prefixes: PrefixStore | None):
    """(KV cache, attention mask, hidden states) of the rows' query prefixes, left-padded: encoded now
    (``_encode_prefixes``), or kept in ``prefixes`` from an earlier epoch (without gradients: call under
    ``torch.no_grad``)."""
    if prefixes is None:
        return _encode_prefixes(model, batch, starts, steer.detach())

    def encode(rows: list[int]):
        return _encode_prefixes(model, _rows(batch, rows), starts[rows], steer.detach())

    return prefixes.states(batch["input_ids"], starts, encode, model.lm.config)


def _suffix_pass(
    model,
    batch: dict,
    starts: torch.Tensor,
    steer: torch.Tensor,
    prefixes: PrefixStore | None,
    packable=False,
):
    """``suffix_hidden``'s states and labels, and what a later pass over the suffix attends to: (the suffix ids,
    the KV cache of prefix and suffix, its attention mask: the prefix left-padded, the suffix right-padded).
    ``packable``: the suffixes run packed where that pays (``_packing_pays``), and then nothing is attended to
    later (None)."""
    with torch.no_grad():
        cache, mask, routing = _prefix_states(model, batch, starts, steer, prefixes)
    suffix, suffix_mask, labels = _split_suffix(batch, starts)
    real = suffix_mask.bool()
    if packable and len(suffix) > 1 and _packing_pays(real, mask, model.lm.config.hidden_size):
        hidden, attended = _packed_suffix(model, suffix, real, starts, cache, mask, steer), None
    else:
        position_ids = starts.unsqueeze(-1) + positions(suffix_mask)
        mask = torch.cat([mask, suffix_mask], dim=-1)
        hidden, cache = model.hidden(suffix, mask, position_ids, cache, steer)
        attended = suffix, cache, mask
    return torch.cat([routing[:, -1:], hidden[:, :-1]], dim=1), labels, attended


def segment_hidden(model, batch: dict, starts: torch.Tensor, steer: torch.Tensor, prefixes: PrefixStore | None):
    """``suffix_hidden``'s states and labels, back-propagating each labelled segment on its own
    (``TrainConfig.segment_backprop``): the whole record once without gradients, then every segment (a run of
    labels: a memory token, its arguments and the EOS ending the turn; an answer) with gradients, attending to
    the detached states before it.  What the loss does not need (tool results, the turns around them) is never
    back-propagated, and a memory row's input side learns from its own segment's loss only; with one segment a
    record this is exact.  All segments of a batch run in one pass: each row's segments packed side by side, kept
    apart by the attention mask (``_segment_packing``).  A batch of one segment a record takes ``suffix_hidden``:
    exact there, and cheaper."""
    runs, inside = _segment_starts(batch["labels"]), _inside_segments(batch["labels"])
    most, width = torch.stack([runs.sum(-1).max(), inside.sum(-1).max()]).tolist()  # one host sync
    if distributed.layers_sharded(model.lm):  # every rank runs the same passes
        most, width = (distributed.global_max(count, model.device) for count in (most, width))
    if most <= 1:
        return suffix_hidden(model, batch, starts, steer, prefixes)
    with torch.no_grad():
        context, labels, (suffix, cache, mask) = _suffix_pass(model, batch, starts, steer.detach(), prefixes)
    if width == 0:  # every segment is one label, predicted by the state before it: the context's
        return context, labels
    inside = _inside_segments(labels)
    columns, allowed = _segment_packing(labels, inside, mask, width)
    position_ids = starts.unsqueeze(-1) + columns
    hidden, _ = model.hidden(suffix.gather(1, columns), _attention_mask(model, allowed), position_ids, cache, steer)
    return _with_segments(context, hidden, inside), labels


def _attention_mask(model, allowed: torch.Tensor) -> torch.Tensor:
    """A (batch, 1, queries, keys) mask of where each query may attend, as the backbone's attention takes it:
    boolean for SDPA, additive (0 or the dtype's minimum) for the eager implementation."""
    if model.lm.config._attn_implementation == "sdpa":
        return allowed.unsqueeze(1)
    dtype = model.lm.dtype
    additive = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return additive.masked_fill(~allowed, torch.finfo(dtype).min).unsqueeze(1)


def _encode_prefixes(model, batch: dict, starts: torch.Tensor, steer: torch.Tensor):
    """(KV cache, attention mask, hidden states) of the rows' query prefixes, left-padded: first the ids every
    row starts with (the chat template's system prompt, typically) once for the whole batch, then each row's
    rest of the prefix."""
    shared = _shared_width(batch["input_ids"], starts)
    if distributed.layers_sharded(model.lm):  # every rank runs the shared pass, or none does
        shared = shared * distributed.all_ranks(shared > 0)
    shared, prefix, prefix_mask = _split_prefix(batch, starts, shared)
    rows, width = len(prefix), shared.shape[1]
    cache = model.prefix_cache(shared, steer) if width else DynamicCache(config=model.lm.config)
    cache.batch_repeat_interleave(rows)
    mask = torch.cat([prefix_mask.new_ones(rows, width), prefix_mask], dim=-1)
    hidden, cache = model.hidden(prefix, mask, width + positions(prefix_mask), cache, steer)
    return cache, mask, hidden


def _shared_width(ids: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """How many ids every row starts with, short of each row's last prefix id (whose state routes)."""
    common = (ids == ids[:1]).all(0).long().cumprod(0).sum()
    return torch.minimum(common, starts.min() - 1)


def _split_prefix(batch: dict, starts: torch.Tensor, shared: torch.Tensor):
    """(shared ids) (1, ``shared``) and (prefix ids, prefix mask) left-padded: the rest up to each row's first label.

    Gathers, not a loop over rows: one host sync (the two widths) whatever the batch size.
    """
    ids = batch["input_ids"]
    shared_width, prefix_width = torch.stack([shared, starts.max() - shared]).tolist()
    prefix_columns = torch.arange(prefix_width, device=ids.device) + (starts - prefix_width).unsqueeze(-1)
    prefix_mask = (prefix_columns >= shared_width).long()
    prefix = ids.gather(1, prefix_columns.clamp(min=0)) * prefix_mask
    return ids[:1, :shared_width], prefix, prefix_mask


def _packing_pays(real: torch.Tensor, prefix_mask: torch.Tensor, width: int) -> bool:
    """Whether packing the suffixes (``real``: their tokens, right-padded) into one row costs fewer FLOPs than the
    padded batch: it saves the padding positions (~12·d² a layer each: projections and MLP) but its one block-masked
    attention spans every row's keys (~4·d a layer per query-key pair).  Short uneven suffixes on long prefixes (SNI
    answers) pack; long ones with little padding (tool loops' results) do not.  One host sync."""
    rows, suffix_width = real.shape
    tokens, keys = torch.stack([real.sum(), prefix_mask.sum()]).tolist()
    padded_pairs = rows * suffix_width * (prefix_mask.shape[1] + suffix_width)
    saved_positions = rows * suffix_width - tokens
    return saved_positions * 3 * width > tokens * (keys + tokens) - padded_pairs


def _split_suffix(batch: dict, starts: torch.Tensor):
    """(suffix ids, suffix mask, suffix labels) right-padded: each row from its first label on (one host sync)."""
    ids, labels = batch["input_ids"], batch["labels"]
    lengths = batch["attention_mask"].sum(-1)
    suffix_width = int((lengths - starts).max())
    suffix_columns = torch.arange(suffix_width, device=ids.device) + starts.unsqueeze(-1)
    suffix_mask = (suffix_columns < lengths.unsqueeze(-1)).long()
    suffix_columns = suffix_columns.clamp(max=ids.shape[1] - 1)
    suffix = ids.gather(1, suffix_columns) * suffix_mask
    suffix_labels = labels.gather(1, suffix_columns).masked_fill(suffix_mask == 0, IGNORE)
    return suffix, suffix_mask, suffix_labels


def _inside_segments(labels: torch.Tensor) -> torch.Tensor:
    """Which suffix columns' states predict a label of their own segment (a run of labels): the column and the next
    one both labelled.  A segment's first label is predicted by the state before the segment, the context's."""
    labelled = labels != IGNORE
    return labelled & nn.functional.pad(labelled[:, 1:], (0, 1))


def _segment_starts(labels: torch.Tensor) -> torch.Tensor:
    """Where each segment (run of labels) starts."""
    labelled = labels != IGNORE
    return labelled & ~nn.functional.pad(labelled[:, :-1], (1, 0))


def _segment_packing(labels: torch.Tensor, inside: torch.Tensor, mask: torch.Tensor, width: int):
    """(columns, allowed): the suffix columns ``inside`` their segments packed to the left of each row (right-padded
    to ``width``), and where each may attend, (batch, width, keys): the cache's real columns (``mask``: the prefix's,
    then the suffix's) before its segment starts, then its own segment's packed columns up to itself.  A padding
    column attends to itself only (a query that attends to nothing would give NaN)."""
    suffix_width = labels.shape[1]
    column = torch.arange(suffix_width, device=labels.device)
    segment_start = torch.where(_segment_starts(labels), column, 0).cummax(-1).values
    columns = torch.where(inside, column, suffix_width + column).argsort(-1)[:, :width]
    segment = segment_start.gather(1, columns).unsqueeze(-1)  # (batch, width, 1)
    keys = torch.arange(mask.shape[1], device=mask.device) - (mask.shape[1] - suffix_width)  # in suffix columns
    before = mask.bool().unsqueeze(1) & (keys < segment)
    real = torch.arange(width, device=labels.device) < inside.sum(-1, keepdim=True)
    own = (segment == segment.transpose(1, 2)) & (columns.unsqueeze(1) <= columns.unsqueeze(-1)) & real.unsqueeze(1)
    return columns, torch.cat([before, own | torch.eye(width, dtype=torch.bool, device=own.device)], dim=-1)


def _with_segments(context: torch.Tensor, hidden: torch.Tensor, inside: torch.Tensor) -> torch.Tensor:
    """The states predicting each suffix column: the segments' pass's (``hidden``, packed) where the column before
    is ``inside`` a segment, else the context's."""
    from_segment = nn.functional.pad(inside[:, :-1], (1, 0))
    slots = nn.functional.pad(inside.cumsum(-1)[:, :-1] - 1, (1, 0)).clamp(min=0)
    packed = hidden.gather(1, slots.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
    return torch.where(from_segment.unsqueeze(-1), packed.to(context.dtype), context)


def _rows(batch: dict, rows: list[int]) -> dict:
    """The batch's rows ``rows``."""
    index = torch.tensor(rows, device=batch["input_ids"].device)
    return {name: tensor[index] for name, tensor in batch.items()}
