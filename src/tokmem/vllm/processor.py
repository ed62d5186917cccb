"""The logits processor (vLLM V1 interface) that applies ``tokmem.decode``'s routing rules per request.

Each step, for every row of the batch:
  - the memory slots that are not its own bank's are masked (a request without ``tokmem_bank`` owns
    none, so it decodes as plain vLLM);
  - at its first output position, the open-set rule (``decode.first_token_logits``, on the raw logits,
    so the memory mass is taken before temperature): a memory token, or the plain backbone, or the
    forced procedure;
  - later, memory tokens only after a routed first token and while fewer than ``max_steps``
    (``decode.next_token_logits``'s rule: a blocked row keeps no slot at all).
A row's state (routed or plain, memory tokens so far) is read from its output tokens, which vLLM
shares by reference, so preempted and resumed requests carry on correctly.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from tokmem.decode import first_token_logits
from tokmem.errors import TokMemError
from tokmem.vllm import slots
from tokmem.vllm.options import Options

log = logging.getLogger(__name__)


@dataclass
class _Row:
    """One TokMem request in the batch: its options, its bank's placement, and what it has generated."""

    options: Options
    placement: slots.Placement | None  # None: the bank could not be placed (the row is made to end at once)
    output: list[int]  # vLLM's live list of the request's output tokens
    forced: int = -1  # the forced procedure's slot, or -1
    seen: int = 0
    plain: bool = False
    steps: int = 0  # memory tokens generated

    @property
    def blocked(self) -> bool:
        """No memory token at the next position: answered as the plain backbone, or ``max_steps`` reached."""
        return self.seen > 0 and (self.plain or self.steps >= self.options.max_steps)

    def catch_up(self, vocab: int) -> None:
        new = self.output[self.seen :]
        if new and self.seen == 0:
            self.plain = new[0] < vocab
        self.steps += sum(token >= vocab for token in new)
        self.seen = len(self.output)


class TokMemLogitsProcessor(LogitsProcessor):
    """Selected per request by ``SamplingParams.extra_args`` (see ``tokmem.vllm.options``)."""

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        """Runs in the front end before a request is queued: bad options are the client's error (HTTP 400)."""
        options = Options.from_extra_args(sampling_params.extra_args)
        if options is not None:
            options.check_bank()

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        self.vocab = vllm_config.model_config.get_vocab_size()
        self.eos = _eos_ids(vllm_config)
        self.rows: dict[int, _Row] = {}  # batch index -> TokMem request

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is not None:
            self._update_rows(batch_update)
        for row in self.rows.values():
            row.catch_up(self.vocab)

    def _update_rows(self, update: BatchUpdate) -> None:
        for index in update.removed:
            self._drop(index)
        for index, params, _, output in update.added:
            self._drop(index)
            options = Options.from_extra_args(params.extra_args)
            if options is not None:
                self.rows[index] = self._new_row(options, output)
        for a, b, direction in update.moved:
            row_a, row_b = self.rows.pop(a, None), self.rows.pop(b, None)
            if row_a is not None:
                self.rows[b] = row_a
            if direction == MoveDirectionality.SWAP and row_b is not None:
                self.rows[a] = row_b
            elif row_b is not None:
                _release(row_b)

    def _drop(self, index: int) -> None:
        row = self.rows.pop(index, None)
        if row is not None:
            _release(row)

    @staticmethod
    def _new_row(options: Options, output: list[int]) -> _Row:
        """The request's row with its bank placed in the slots; unplaced if the bank changed since the front end
        checked it, or the slots are full (an error is logged, the request ends at once)."""
        table, placement = slots.current(), None
        try:
            placement = table.acquire(options.bank)
            forced = -1 if options.procedure is None else placement.offset + placement.bank.row(options.procedure)
            return _Row(options, placement, output, forced)
        except (TokMemError, OSError) as err:
            if placement is not None:
                table.release(placement)
            log.error("tokmem: the request with bank %s ends without an answer: %s", options.bank, err)
            return _Row(options, None, output)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Each row keeps only the slots ``[offset, end)``: its bank's, or none where memory is blocked
        (``decode.next_token_logits``'s rule, folded into the range so the whole batch costs one in-place mask);
        rows at their first position then get ``decode.first_token_logits``."""
        state = self._state(len(logits))
        offset, end, threshold, forced = (t.to(logits.device, non_blocking=True) for t in state[1:])
        _keep_slots(
            logits[:, self.vocab :], offset, end - offset, int((state[2] - state[1]).max()) if len(logits) else 0
        )
        if state[0].any():  # rows at their first position (checked on the host: the state is built there)
            at = state[0].nonzero().squeeze(-1).to(logits.device)
            logits[at] = first_token_logits(logits[at], self.vocab, threshold[at], end[at] > offset[at], forced[at])[0]
        return self._end_unplaced(logits)

    def _state(self, batch: int) -> tuple[torch.Tensor, ...]:
        """Per batch row: at the first position; the slots it may emit, ``[offset, end)`` (empty where memory is
        blocked: no bank placed, open set, or ``max_steps`` reached); threshold; forced memory id (-1: none)."""
        rows = [self.rows.get(i) for i in range(batch)]
        rows = [row if row is not None and row.placement is not None else None for row in rows]
        offsets = [row.placement.offset if row else 0 for row in rows]
        return (
            torch.tensor([bool(row) and row.seen == 0 for row in rows]),
            torch.tensor(offsets),
            torch.tensor([o + (row.placement.rows if row and not row.blocked else 0) for o, row in zip(offsets, rows)]),
            torch.tensor([row.options.threshold if row else 0.0 for row in rows]),
            torch.tensor([self.vocab + row.forced if row and row.forced >= 0 else -1 for row in rows]),
        )

    def _end_unplaced(self, logits: torch.Tensor) -> torch.Tensor:
        """Rows whose bank could not be placed may only end (EOS): an empty answer, never a wrong one."""
        unplaced = [i for i, row in self.rows.items() if row.placement is None and i < len(logits)]
        if unplaced and self.eos:
            keep = logits[unplaced][:, self.eos].clone()
            logits[unplaced] = float("-inf")
            logits[torch.tensor(unplaced).unsqueeze(-1), torch.tensor(self.eos)] = keep
        return logits


def _keep_slots(memory: torch.Tensor, offset: torch.Tensor, count: torch.Tensor, widest: int) -> None:
    """Set every slot column of each row to -inf except its ``count`` slots from ``offset`` (in place).

    The kept values (at most ``widest`` per row) are gathered, the whole block is filled, and they are put back:
    one fill over the block rather than a (rows, slots) mask."""
    steps = torch.arange(max(widest, 1), device=memory.device)
    valid = steps < count.unsqueeze(-1)
    index = offset.unsqueeze(-1) + steps.where(valid, 0)  # past a row's slots: its first slot again, same value
    kept = memory.gather(1, index).masked_fill((count == 0).unsqueeze(-1), float("-inf"))
    memory.fill_(float("-inf"))
    memory.scatter_(1, index, kept)


def _release(row: _Row) -> None:
    if row.placement is not None:
        slots.SlotTable.release(row.placement)


def _eos_ids(vllm_config) -> list[int]:
    eos = getattr(vllm_config.model_config.hf_config, "eos_token_id", None)
    return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
