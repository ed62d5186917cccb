"""The logits processor that applies ``tokmem.decoding.decode``'s routing rules per request, for both of vLLM's model
runners.

Each step, for every row of the batch:
  - the memory slots that are not its own bank's are masked (a request without ``tokmem_bank`` owns
    none, so it decodes as plain vLLM);
  - at its first output position, the open-set rule (``decode.first_token_logits``, on the raw logits,
    so the memory mass is taken before temperature): a memory token, or the plain backbone, or the
    forced procedure;
  - later, memory tokens only after a routed first token and while fewer than ``max_steps``
    (``decode.next_token_logits``'s rule: a blocked row keeps no slot at all);
  - after a memory token of a bank with tails or shared rows, those ids, one a step (``tokmem.bank.memory_ids``, the
  rule
    ``decode.step`` applies): every other column of the row at -inf.
A row's state (routed or plain, memory tokens so far) is read from its output tokens, so preempted and resumed
requests carry on correctly.

vLLM 0.32 runs one of two model runners (Model Runner V2 by default on GPUs with Triton, V1 elsewhere), each
with its own logits-processor interface, and reads the one ``--logits-processors`` name for either.  So
``TokMemLogitsProcessor`` implements both: under V1 (``__init__(vllm_config, device, is_pin_memory)``,
``update_state``, ``apply(logits)``) rows are batch indices and vLLM shares each request's output list; under V2
(``__init__(vllm_config, req_states)``, ``add_request``, ``apply(logits, ctx)``) rows map to persistent request
slots and the outputs are read from the runner's token buffer on the device.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality
from vllm.v1.sample.logits_processor import LogitsProcessor as BatchProcessor
from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as SlotProcessor

from tokmem.bank.memory_ids import ContextLayout, routes
from tokmem.decoding.decode import first_token_logits, open_set_threshold
from tokmem.errors import TokMemError
from tokmem.vllm import slots
from tokmem.vllm.options import Options

log = logging.getLogger(__name__)


@dataclass
class _Request:
    """One TokMem request: its options and its bank's placement in the slots."""

    options: Options
    placement: slots.Placement | None  # None: the bank could not be placed (the request is made to end at once)
    forced: int = -1  # the forced procedure's slot, or -1

    @classmethod
    def place(cls, options: Options) -> _Request:
        """The request with its bank placed; unplaced if the bank changed since the front end checked it, or the
        slots are full (an error is logged, the request ends at once)."""
        table, placement = slots.current(), None
        try:
            placement = table.acquire(options.bank)
            forced = -1 if options.procedure is None else placement.offset + placement.bank.row(options.procedure)
            return cls(options, placement, forced)
        except (TokMemError, OSError) as err:
            if placement is not None:
                table.release(placement)
            log.error("tokmem: the request with bank %s ends without an answer: %s", options.bank, err)
            return cls(options, None)

    def release(self) -> None:
        if self.placement is not None:
            slots.SlotTable.release(self.placement)

    @property
    def threshold(self) -> float:
        """The open-set threshold: the request's, else its bank's (``decode.open_set_threshold``); placed only."""
        return open_set_threshold(self.placement.bank, self.options.threshold)

    def routes(self, token: int, vocab: int) -> bool:
        """Whether ``token`` is one of its bank's memory tokens that route (a segment), not a context id."""
        return self.placement is not None and routes(token, vocab, self.placement.rows, self.placement.offset)


@dataclass
class _Row:
    """V1: a TokMem request in a batch row and what it has generated so far."""

    request: _Request
    output: list[int]  # vLLM's live list of the request's output tokens
    seen: int = 0
    plain: bool = False
    steps: int = 0  # memory tokens generated

    @property
    def blocked(self) -> bool:
        """No memory token at the next position: answered as the plain backbone, or ``max_steps`` reached."""
        return self.seen > 0 and (self.plain or self.steps >= self.request.options.max_steps)

    def catch_up(self, vocab: int) -> None:
        new = self.output[self.seen :]
        if new and self.seen == 0:
            self.plain = new[0] < vocab
        self.steps += sum(self.request.routes(token, vocab) for token in new)
        self.seen = len(self.output)


@dataclass
class _State:
    """Per batch row: at its first output position (host); the slots it may emit, ``[offset, end)`` (empty where
    memory is blocked); the open-set threshold; the forced memory id (-1: none); the rows whose bank could not
    be placed (host); the token fed now (-1: none) and where its bank's context ids sit (None: no bank has any)."""

    first: torch.Tensor
    offset: torch.Tensor
    end: torch.Tensor
    threshold: torch.Tensor
    forced: torch.Tensor
    widest: int  # the most slots a row keeps
    unplaced: list[int]
    last: torch.Tensor
    context: ContextLayout | None


class TokMemLogitsProcessor(BatchProcessor, SlotProcessor):
    """Selected per request by ``SamplingParams.extra_args`` (see ``tokmem.vllm.options``); both runners' interfaces
    (see the module's docstring)."""

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        """Runs in the front end before a request is queued: bad options are the client's error (HTTP 400)."""
        options = Options.from_extra_args(sampling_params.extra_args)
        if options is not None:
            options.check_bank()

    def __init__(self, vllm_config, *runner_args):
        self.vocab = vllm_config.model_config.get_vocab_size()
        self.eos = _eos_ids(vllm_config)
        self.rows: dict[int, _Row] = {}  # V1: batch index -> TokMem request
        self.requests: dict[int, _Request] = {}  # V2: request slot -> TokMem request
        self.req_states = runner_args[0] if len(runner_args) == 1 else None  # V2's request state

    # ---- V1 ------------------------------------------------------------------------------------------------
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
                self.rows[index] = _Row(_Request.place(options), output)
        for a, b, direction in update.moved:
            row_a, row_b = self.rows.pop(a, None), self.rows.pop(b, None)
            if row_a is not None:
                self.rows[b] = row_a
            if direction == MoveDirectionality.SWAP and row_b is not None:
                self.rows[a] = row_b
            elif row_b is not None:
                row_b.request.release()

    def _drop(self, index: int) -> None:
        row = self.rows.pop(index, None)
        if row is not None:
            row.request.release()

    def _batch_state(self, batch: int) -> _State:
        rows = [self.rows.get(i) for i in range(batch)]
        placed = [row if row is not None and row.request.placement is not None else None for row in rows]
        offset = torch.tensor([row.request.placement.offset if row else 0 for row in placed])
        count = torch.tensor([row.request.placement.rows if row and not row.blocked else 0 for row in placed])
        return _State(
            torch.tensor([bool(row) and row.seen == 0 for row in placed]),
            offset,
            offset + count,
            torch.tensor([row.request.threshold if row else 0.0 for row in placed]),
            torch.tensor(
                [self.vocab + row.request.forced if row and row.request.forced >= 0 else -1 for row in placed]
            ),
            int(count.max()) if batch else 0,
            [i for i, row in self.rows.items() if row.request.placement is None and i < batch],
            torch.tensor([row.output[-1] if row and row.output else -1 for row in placed]),
            _context([row.request if row else None for row in placed]),
        )

    # ---- Model Runner V2 -------------------------------------------------------------------------------------
    def add_request(self, req_idx: int, sampling_params) -> bool:
        """Every request is processed: one without a bank still has every memory slot masked."""
        previous = self.requests.pop(req_idx, None)  # the slot's earlier request has finished
        if previous is not None:
            previous.release()
        options = Options.from_extra_args(sampling_params.extra_args)
        if options is not None:
            self.requests[req_idx] = _Request.place(options)
        return True

    def _slot_state(self, batch: int, ctx) -> _State:
        """The state from each request's tokens: its output so far is ``all_token_ids[slot, prompt_len:pos]``
        and the token fed at ``pos`` (``ctx.input_ids``), read on the device; whether a row is at its first
        position and how long its output is are known on the host (``seq_lens_upper_bound_np``, exact without
        speculative decoding, which is refused)."""
        if batch != len(ctx.idx_mapping_np):
            raise TokMemError("tokmem: speculative decoding (several logits rows a request) is not supported")
        requests = [self.requests.get(int(slot)) for slot in ctx.idx_mapping_np]
        placed = [r if r is not None and r.placement is not None else None for r in requests]
        made = torch.as_tensor(ctx.seq_lens_upper_bound_np - self.req_states.prompt_len.np[ctx.idx_mapping_np])
        offset = torch.tensor([r.placement.offset if r else 0 for r in placed])
        count = torch.tensor([r.placement.rows if r else 0 for r in placed])
        max_steps = torch.tensor([r.options.max_steps if r else 1 for r in placed])
        blocked = self._blocked(ctx, made, max_steps, offset, count)
        return _State(
            torch.tensor([bool(r) for r in placed]) & (made <= 0),
            offset,
            offset.to(blocked.device) + count.to(blocked.device) * ~blocked,
            torch.tensor([r.threshold if r else 0.0 for r in placed]),
            torch.tensor([self.vocab + r.forced if r and r.forced >= 0 else -1 for r in placed]),
            int(count.max()) if batch else 0,
            [i for i, r in enumerate(requests) if r is not None and r.placement is None],
            ctx.input_ids,
            _context(placed),
        )

    def _blocked(self, ctx, made, max_steps, offset, rows) -> torch.Tensor:
        """Per row, on the device: memory blocked at the next position (a plain first output token, or
        ``max_steps`` memory tokens that route so far: ids in ``[offset, offset + rows)`` of the slots); rows with
        no output yet are not blocked."""
        device = ctx.input_ids.device
        offset, rows = offset.to(device).unsqueeze(-1), rows.to(device).unsqueeze(-1)
        width = max(int(made.max()) - 1, 1) if len(made) else 1  # host values: no device sync
        made = made.to(device)
        start = torch.as_tensor(self.req_states.prompt_len.np[ctx.idx_mapping_np], device=device).unsqueeze(-1)
        steps = torch.arange(width, device=device)
        earlier = steps < (made - 1).unsqueeze(-1)  # outputs before the one fed now
        columns = (start + steps).clamp(max=self.req_states.all_token_ids.gpu.shape[1] - 1)
        history = self.req_states.all_token_ids.gpu[ctx.idx_mapping.long().unsqueeze(-1), columns]
        last = ctx.input_ids
        routed = lambda ids: routes(ids, self.vocab, rows, offset)  # noqa: E731
        memory = (routed(history) & earlier).sum(-1) + routed(last.unsqueeze(-1)).squeeze(-1).long()
        first = torch.where(made > 1, history[:, 0], last)
        return (made > 0) & ((first < self.vocab) | (memory >= max_steps.to(device)))

    # ---- both ----------------------------------------------------------------------------------------------
    def apply(self, logits: torch.Tensor, ctx=None) -> torch.Tensor:
        """Each row keeps only the slots ``[offset, end)``: its bank's, or none where memory is blocked
        (``decode.next_token_logits``'s rule, folded into the range so the whole batch costs one in-place mask);
        rows at their first position then get ``decode.first_token_logits``; rows after a memory token of a bank
        with context ids, the next of those alone."""
        state = self._batch_state(len(logits)) if ctx is None else self._slot_state(len(logits), ctx)
        offset, end, threshold, forced = (
            t.to(logits.device, non_blocking=True) for t in (state.offset, state.end, state.threshold, state.forced)
        )
        _keep_slots(logits[:, self.vocab :], offset, end - offset, state.widest)
        if state.first.any():  # rows at their first position (known on the host)
            at = state.first.nonzero().squeeze(-1).to(logits.device)
            logits[at] = first_token_logits(logits[at], self.vocab, threshold[at], end[at] > offset[at], forced[at])[0]
        if state.context is not None:
            context = state.context.to(logits.device)
            _force(logits, context.after(state.last.to(logits.device), self.vocab))
        return self._end_unplaced(logits, state.unplaced)

    def _end_unplaced(self, logits: torch.Tensor, unplaced: list[int]) -> torch.Tensor:
        """Rows whose bank could not be placed may only end (EOS): an empty answer, never a wrong one."""
        if unplaced and self.eos:
            keep = logits[unplaced][:, self.eos].clone()
            logits[unplaced] = float("-inf")
            logits[torch.tensor(unplaced).unsqueeze(-1), torch.tensor(self.eos)] = keep
        return logits


def _context(requests: list[_Request | None]) -> ContextLayout | None:
    """Where each row's bank (placed; None: no bank) has its context ids in the slots, or None where none has any."""
    placements = [r.placement if r else None for r in requests]
    return ContextLayout.of(
        [p.bank if p else None for p in placements], "cpu", [p.offset if p else 0 for p in placements]
    )


def _force(logits: torch.Tensor, following: torch.Tensor) -> None:
    """Each row whose ``following`` is an id (not -1) keeps that column alone (in place, branch-free)."""
    forced = (following >= 0).unsqueeze(-1)
    column = following.clamp(min=0).unsqueeze(-1)
    logits.masked_fill_(forced, float("-inf"))
    logits.scatter_(1, column, torch.where(forced, 0.0, logits.gather(1, column)))


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


def _eos_ids(vllm_config) -> list[int]:
    eos = getattr(vllm_config.model_config.hf_config, "eos_token_id", None)
    return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
