"""The context ids that follow a memory token: where a bank's tails and shared rows sit above its rows, and the rule
every decoder applies to lay them out (``tokmem.decoding.decode``'s loop, the server's engine, the vLLM plugin).

A bank of n rows, k memory tokens a tool and s shared rows has ids ``vocab + j`` for j in (relative to the vocabulary):

    [0, n)                 the rows: the memory tokens that route (the LM head scores them)
    [n, n + n(k-1))        the tails: row r's k - 1 ids from n + r(k-1)
    [n + n(k-1), ... + s)  the shared rows every tool reads after its own

The input side is laid out in that order (``input_rows``).  Tails and shared rows are read, never written: after a
memory token, a decoder feeds its tail then the shared rows, forced one a step (``ContextLayout.after``), before the
arguments; so a call is laid out as training laid it out (``tokmem.training.sequences``) and a chain may go on to the
next call in the same answer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def input_rows(steer: torch.Tensor, tail: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
    """The input side over every memory id: the rows' ``steer`` (n, d), then each row's ``tail`` (n, k-1, d), then
    the ``shared`` rows (s, d)."""
    return torch.cat([steer, tail.flatten(0, 1), shared])


def id_count(bank) -> int:
    """How many ids a bank (``MemoryBank``) has above the vocabulary: its rows, their tails, its shared rows."""
    return len(bank) * bank.memory_tokens + bank.shared_tokens


def tail_ids(vocab: int, rows: int, width: int, shared: int, memory: int) -> list[int]:
    """The context ids that follow memory token ``memory`` of a bank of ``rows`` rows, tails of ``width`` ids and
    ``shared`` shared rows: its tail, then the shared rows."""
    start = vocab + rows + (memory - vocab) * width
    first_shared = vocab + rows + rows * width
    return [*range(start, start + width), *range(first_shared, first_shared + shared)]


def routes(ids, vocab: int, rows, offset=0):
    """Whether each id (a tensor, or one int) is a memory token that routes (one of ``rows`` rows at ``offset``), not
    a context id or a word."""
    j = ids - vocab - offset
    return (j >= 0) & (j < rows)


@dataclass
class ContextLayout:
    """Per batch row (tensors, or one value for every row): its bank's ``rows``, tail ``width`` (memory tokens a
    tool - 1) and ``shared`` rows, its ids ``offset`` from the vocabulary's end (the vLLM plugin's slot; 0 elsewhere)."""

    rows: torch.Tensor
    width: torch.Tensor
    shared: torch.Tensor
    offset: torch.Tensor | int = 0

    @classmethod
    def of(cls, banks: list, device, offsets: list[int] | None = None) -> ContextLayout | None:
        """The layout of each row's bank (``MemoryBank``s, one a row or one for every row; None: a row without a
        bank, nothing forced), at ``offsets`` (default 0), or None where no bank has context rows."""
        if not any(b is not None and b.context_rows() for b in banks):
            return None
        values = lambda field: torch.tensor([0 if b is None else field(b) for b in banks], device=device)  # noqa: E731
        offset = 0 if offsets is None else torch.tensor(offsets, device=device)
        return cls(values(len), values(lambda b: b.memory_tokens - 1), values(lambda b: b.shared_tokens), offset)

    def to(self, device) -> ContextLayout:
        return ContextLayout(*(torch.as_tensor(v).to(device, non_blocking=True) for v in vars(self).values()))

    def after(self, last: torch.Tensor, vocab: int) -> torch.Tensor:
        """Per row, the context id that must follow ``last`` (the token just fed): after a memory token the first of
        its tail, after a tail id the next (then the first shared row), after a shared row the next; else -1."""
        j = last - vocab - self.offset
        first_shared = self.rows * (1 + self.width)
        end = first_shared + self.shared
        chain_end = torch.where(self.shared > 0, first_shared, -1)  # after a tool's own ids: the shared rows, or none
        from_row = torch.where(self.width > 0, self.rows + j * self.width, chain_end)
        last_of_tail = (j - self.rows).remainder(self.width.clamp(min=1)) == self.width - 1
        from_tail = torch.where(last_of_tail, chain_end, j + 1)
        from_shared = torch.where(j + 1 < end, j + 1, -1)
        following = torch.where(j < self.rows, from_row, torch.where(j < first_shared, from_tail, from_shared))
        following = torch.where((j >= 0) & (j < end), following, -1)
        return torch.where(following >= 0, following + vocab + self.offset, -1)

    def routes(self, ids: torch.Tensor, vocab: int) -> torch.Tensor:
        """Whether each id is a memory token that routes (a row's), not a context id."""
        return routes(ids, vocab, self.rows, self.offset)
