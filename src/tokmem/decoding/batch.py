"""The running batch of a decoding loop: rows left-padded into one KV cache, and each row's decoding state.

``tokmem.decoding.decode`` (``generate``, ``tokmem.chat``) and the server's engine decode on it with the same prefill
and step (``decode.prefill``, ``decode.step``); the engine also joins newly prefilled rows to it and lets finished ones
leave (``join``, ``select``), and ``chat`` joins the KV caches its conversations kept (``join_caches``).  Padding is
always on the left, masked in the attention mask, and each row keeps its own position ids, so it never shifts a row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch.nn.functional import pad
from transformers import DynamicCache

if TYPE_CHECKING:
    from tokmem.decoding.grammar import ArgumentGrammar


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
    return pad(states, (0, 0, width - states.shape[2], 0))


def join_caches(
    parts: list[tuple[DynamicCache, torch.Tensor]], into: DynamicCache
) -> tuple[DynamicCache, torch.Tensor]:
    """The KV caches of groups of rows, each with its attention mask (rows, columns), stacked along the batch into
    ``into`` (a new cache, or one of the parts': its states are replaced), each left-padded with masked columns to
    the widest; (the cache, its mask).  A cache that holds nothing joins as padding columns only."""
    width = max(mask.shape[1] for _, mask in parts)
    joined = torch.cat([pad(mask, (width - mask.shape[1], 0)) for _, mask in parts])
    filled = next((kv for kv, _ in parts if kv.get_seq_length()), None)
    if filled is None:
        return into, joined
    for index, layer in enumerate(into.layers):
        states = [_layer_states(kv, index, filled.layers[index], len(mask)) for kv, mask in parts]
        keys = torch.cat([left_pad_columns(k, width) for k, _ in states])
        values = torch.cat([left_pad_columns(v, width) for _, v in states])
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values
    return into, joined


def _layer_states(kv: DynamicCache, layer: int, like, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A cache's keys and values at ``layer``; a cache of ``rows`` rows that holds nothing gives zero columns (shaped
    as the layer ``like`` of another cache)."""
    if kv.get_seq_length():
        return kv.layers[layer].keys, kv.layers[layer].values
    empty = lambda states: states.new_empty(rows, states.shape[1], 0, states.shape[3])  # noqa: E731
    return empty(like.keys), empty(like.values)


@dataclass
class DecodeBatch:
    """The rows being decoded: their KV cache and attention mask, and each row's state (tensors, one value a row)."""

    cache: DynamicCache
    mask: torch.Tensor  # (rows, columns): 0 where a column is padding or fed after a row was done
    position: torch.Tensor  # the position id of each row's next input
    last: torch.Tensor  # each row's last token (the next input)
    steps: torch.Tensor  # memory tokens so far
    plain: torch.Tensor  # open set: no memory tokens for this row
    max_steps: torch.Tensor
    temperature: torch.Tensor
    top_p: torch.Tensor
    grammar: ArgumentGrammar | None = None  # the rows' schema-bound arguments; None: no row needs one

    def __len__(self) -> int:
        return len(self.last)

    def join(self, other: DecodeBatch, grammar: ArgumentGrammar | None) -> DecodeBatch:
        """These rows, then ``other``'s (this batch's cache becomes the joined one); ``grammar``: the joined rows'."""
        cache, mask = join_caches([(self.cache, self.mask), (other.cache, other.mask)], into=self.cache)
        state = [torch.cat([mine, theirs]) for mine, theirs in zip(self._state(), other._state())]
        return DecodeBatch(cache, mask, *state, grammar)

    def select(self, keep: list[int]) -> DecodeBatch:
        """The rows ``keep``, without the leading columns none of them attends to (this batch's cache is cut)."""
        rows = torch.tensor(keep, device=self.mask.device)
        mask = self.mask[rows]
        start = int(mask.any(0).int().argmax())
        for layer in self.cache.layers:
            layer.keys, layer.values = layer.keys[rows, :, start:], layer.values[rows, :, start:]
        grammar = None if self.grammar is None else self.grammar.select(keep)
        return DecodeBatch(self.cache, mask[:, start:], *(t[rows] for t in self._state()), grammar)

    def _state(self) -> list[torch.Tensor]:
        return [self.position, self.last, self.steps, self.plain, self.max_steps, self.temperature, self.top_p]
