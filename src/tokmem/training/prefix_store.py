"""The query prefixes' KV states, kept across a training run's epochs.

With a frozen backbone, everything before an example's first memory token is the same in every epoch (it does not
depend on the bank): ``loss.batch_loss`` encodes it without gradients, and with a ``PrefixStore`` only once a run.
Each example's prefix is kept whole, keyed by its ids (batches are shuffled anew each epoch), as its KV states
(layers, key/value, heads, length, head dim) in the dtype the backbone computed them in, and the final hidden state of
its last token (which predicts the first memory token).  A batch of stored prefixes is laid out left-padded, so each
row's suffix follows its own prefix.  Prefixes beyond the memory budget are not kept: they are encoded again next
time, as without a store.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
from transformers import DynamicCache

Entry = tuple[torch.Tensor, torch.Tensor]  # (kv (layers, 2, heads, length, head dim), last hidden state (d,))
Encoder = Callable[[list[int]], tuple[DynamicCache, torch.Tensor, torch.Tensor]]
BUDGET_SHARE = 0.25  # of the memory free on the device when the run starts, by default


class PrefixStore:
    def __init__(self, budget: int):
        self.budget = budget
        self.used = 0
        self.entries: dict[bytes, Entry] = {}

    def states(self, ids: torch.Tensor, starts: torch.Tensor, encode: Encoder, config):
        """(KV cache, attention mask, last hidden states (rows, 1, d)) of each row's prefix ``ids[row, :start]``,
        left-padded.  ``encode(rows)`` encodes the prefixes of those rows (a cache, its mask, its hidden states,
        as ``loss._encode_prefixes``): only those not stored are encoded, and kept while the budget lasts."""
        keys = [row[:start].numpy().tobytes() for row, start in zip(ids.cpu(), starts.tolist())]
        missing = [i for i, key in enumerate(keys) if key not in self.entries]
        fresh = dict(zip([keys[i] for i in missing], _rows(*encode(missing)))) if missing else {}
        for key, entry in fresh.items():
            self._keep(key, entry)
        return _left_padded([fresh[key] if key in fresh else self.entries[key] for key in keys], config)

    def _keep(self, key: bytes, entry: Entry) -> None:
        size = sum(t.numel() * t.element_size() for t in entry)
        if self.used + size <= self.budget:
            self.entries[key] = entry
            self.used += size


def default_budget(device: torch.device) -> int:
    """``BUDGET_SHARE`` of the memory free on ``device`` now: the GPU's, or the host's RAM."""
    if device.type == "cuda":
        return int(BUDGET_SHARE * torch.cuda.mem_get_info(device)[0])
    return int(BUDGET_SHARE * os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def _rows(cache: DynamicCache, mask: torch.Tensor, hidden: torch.Tensor) -> list[Entry]:
    """Each row's own positions (those its mask keeps) out of a batch's cache, and its last hidden state (copies:
    nothing of the batch's tensors stays alive)."""
    kv = torch.stack([torch.stack([layer.keys, layer.values]) for layer in cache.layers])  # (L, 2, B, H, T, hd)
    return [(kv[:, :, i][:, :, :, row.bool()], hidden[i, -1].clone()) for i, row in enumerate(mask)]


def _left_padded(entries: list[Entry], config):
    """The entries as one batch: a cache whose rows are left-padded to the longest, its mask, the hidden states."""
    lengths = [kv.shape[3] for kv, _ in entries]
    width = max(lengths)
    first = entries[0][0]
    kv = first.new_zeros(first.shape[0], 2, len(entries), first.shape[2], width, first.shape[4])
    for i, ((row, _), length) in enumerate(zip(entries, lengths)):
        kv[:, :, i, :, width - length :] = row
    lengths = torch.tensor(lengths, device=first.device).unsqueeze(-1)
    mask = (torch.arange(width, device=first.device) >= width - lengths).long()
    cache = DynamicCache([(layer[0], layer[1]) for layer in kv], config=config)
    return cache, mask, torch.stack([hidden for _, hidden in entries]).unsqueeze(1)
