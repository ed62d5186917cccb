"""The memory slots of one vLLM worker: a fixed table of S rows above the vocabulary, and the banks in it.

Slot ``s`` is token id ``vocab + s``.  A bank of n rows takes n consecutive slots; its memory ids in
that worker are ``vocab + offset + row``.  A bank with tails or shared rows takes their ids too, right after its
rows (``tokmem.bank.memory_ids``): input rows only, their index side zero (never routed: the logits processor forces
them).  The tables never change shape (S is fixed when the model is
built), rows are copied in place, so a compiled or graph-captured forward stays valid.  Banks no running
request uses stay placed until their slots are needed, then the least recently used go first.

One table per worker process: the model builds it (``install``) and the logits processor, built
separately by vLLM in the same process, places the requests' banks in it (``current``).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch

from tokmem.bank.memory_bank import MemoryBank
from tokmem.bank.memory_ids import id_count, input_rows
from tokmem.errors import TokMemError

DEFAULT_SLOTS = 4096


class SlotsFull(TokMemError):
    """No free run of slots is long enough for a bank, even after evicting every unused bank."""


@dataclass
class Placement:
    """Where one bank revision sits in the table, and how many running requests use it."""

    offset: int
    bank: MemoryBank
    users: int = 0

    @property
    def rows(self) -> int:
        """The bank's rows: the slots that route."""
        return len(self.bank)

    @property
    def end(self) -> int:
        return self.offset + id_count(self.bank)


def bank_key(path) -> tuple[str, int, int]:
    """A bank revision: its resolved path, modification time and size (a bank rewritten in place is a new revision)."""
    path = Path(path).resolve()
    stat = os.stat(path)
    return str(path), stat.st_mtime_ns, stat.st_size


class SlotTable:
    """``index`` (LM-head side) and ``steer`` (input side), (S, d) each, and the placed banks (LRU order)."""

    def __init__(self, slots: int, hidden_size: int, vocab: int, dtype=torch.float32, device=None):
        if slots < 1:
            raise TokMemError(f"tokmem_slots must be at least 1, got {slots}")
        self.vocab = vocab
        self.hidden_size = hidden_size
        self.index = torch.zeros(slots, hidden_size, dtype=dtype, device=device)
        self.steer = torch.zeros(slots, hidden_size, dtype=dtype, device=device)
        self.placed: OrderedDict[tuple, Placement] = OrderedDict()

    @property
    def slots(self) -> int:
        return len(self.index)

    def acquire(self, path) -> Placement:
        """The bank file ``path`` placed in the table (loaded and validated on first use), marked in use."""
        key = bank_key(path)
        placement = self.placed.get(key)
        if placement is None:
            bank = MemoryBank.load(key[0])
            if bank.hidden_size != self.hidden_size:
                raise TokMemError(
                    f"{key[0]}: the bank's rows have width {bank.hidden_size}, this model's hidden size is {self.hidden_size}"
                )
            placement = Placement(self._free_offset(id_count(bank), key[0]), bank)
            self._write(placement)
            self.placed[key] = placement
        self.placed.move_to_end(key)
        placement.users += 1
        return placement

    @staticmethod
    def release(placement: Placement) -> None:
        placement.users -= 1

    def _free_offset(self, needed: int, where: str) -> int:
        """The first offset with ``needed`` free slots after it, evicting unused banks (least recent first) until one
        exists."""
        while True:
            offset = self._first_gap(needed)
            if offset is not None:
                return offset
            unused = next((key for key, p in self.placed.items() if p.users == 0), None)
            if unused is None:
                raise SlotsFull(
                    f"{where}: {needed} slots do not fit in the {self.slots} memory slots next to the banks in use "
                    "(start the model with more tokmem_slots)"
                )
            del self.placed[unused]

    def _first_gap(self, needed: int) -> int | None:
        start = 0
        for placement in sorted(self.placed.values(), key=lambda p: p.offset):
            if placement.offset - start >= needed:
                return start
            start = placement.end
        return start if self.slots - start >= needed else None

    def _write(self, placement: Placement) -> None:
        bank, rows = placement.bank, slice(placement.offset, placement.offset + placement.rows)
        self.index[placement.offset : placement.end] = 0
        self.index[rows] = bank.index.to(self.index)
        self.steer[placement.offset : placement.end] = input_rows(bank.steer_matrix, bank.tail, bank.shared).to(
            self.steer
        )


_table: SlotTable | None = None


def install(table: SlotTable) -> SlotTable:
    """Make ``table`` this process's slot table (the model does, when vLLM builds it)."""
    global _table
    _table = table
    return table


def current() -> SlotTable:
    if _table is None:
        raise TokMemError(
            "no TokMem model in this vLLM worker: start vLLM with tokmem.vllm.engine_args() "
            "(a TokMem*ForCausalLM architecture) to serve banks"
        )
    return _table
