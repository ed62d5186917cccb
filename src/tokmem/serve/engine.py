"""One decoding loop for every request: continuous batching over rows of different banks.

The running batch (``tokmem.decoding.batch.DecodeBatch``) is left-padded and shares one KV cache.  New requests are
prefilled together (left-padded among themselves) and joined to the running batch along the batch dimension, the
shorter cache padded on the left with masked columns; finished, cancelled or timed-out rows leave at once, and
columns no row attends to any more are cut from the left.  Prefill and step are ``tokmem.decoding.decode``'s
(``prefill``, ``step``: the loop ``generate`` and ``chat`` run too); the engine adds the queue, the requests' own
stopping rules (``Handle``) and the guard against NaN logits.

Rows may belong to different banks.  Each batch row gets its bank's rows in a padded table
(batch, widest bank, d), gathered once whenever the batch changes; per step the bank costs one
gather (memory ids' input embeddings) and one batched matmul with masked padding (the extra
logits) — the same two places as offline, never a loop over banks; so greedy answers are token-identical to
``generate``.

A request may limit the memory rows it routes to (``Request.allowed``: OpenAI's ``tools`` / ``tool_choice``,
mapped by ``tokmem.decoding.tool_rules.tool_routing``); the limit is folded into the row's ``valid`` columns, so it
costs nothing per step.  After a tool row's memory token the arguments decode under the tool's schema where the bank
has one, or the client's (``Request.grammars``), and a request with a whole-response schema (``response_format``)
answers in its JSON from the first token (``tokmem.decoding.grammar``; every grammar compiled before the request reaches
the engine: never here): the batch keeps one ``ArgumentGrammar`` whose rows follow the batch's rows, its masks applied
as one tensor op per step, as ``decode`` does offline.

A bank's tails and shared rows are fed after each memory token as ``decode.step`` feeds them (``Banks.context``,
each row its own bank's layout).  A row of a bank that shows its tools' schemas (tokmem+schema) that chose a tool
with its first token leaves the batch and joins it again prefilled with that memory token and its context
(``conversation.context_after``: the tail, the schema) after its prompt, its arguments next
(``Request.with_context_after``): ``tokmem.chat``'s second pass, so the server answers as ``tokmem.chat`` does.

Sampling (temperature > 0) takes each row's ``top_p``; a request with a ``seed`` draws from its own generator, so
it samples the same answer whatever else is in the batch.  A text answer that reaches one of its request's ``stop``
sequences ends there (``serve.stream.StopSequences``).

Every admitted request is finished (answer, error, cancel or timeout), whatever happens to the
others: a group whose prefill fails is prefilled again one request at a time, so only the requests
that fail alone end with an error; a row whose logits are NaN or +inf ends with an error and leaves
the batch at the next step.  Only a failure of the shared decoding step itself ends every running
request (with an error), and ``stop`` ends whatever is left, so nobody waits for a lost request.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace

import torch
from torch.nn.utils.rnn import pad_sequence
from transformers import DynamicCache

from tokmem.backbones import Backbone
from tokmem.bank.memory_bank import MemoryBank
from tokmem.bank.memory_ids import ContextLayout
from tokmem.decoding.batch import DecodeBatch, left_pad
from tokmem.decoding.decode import (
    OPEN_SET_THRESHOLD,
    Banks,
    DecodeConfig,
    Generation,
    Rules,
    prefill,
    step,
    to_generation,
)
from tokmem.errors import BackboneError, TokMemError
from tokmem.decoding.conversation import context_after
from tokmem.decoding.tool_rules import starts_calls
from tokmem.decoding.grammar import ArgumentGrammar
from tokmem.model import TokMemModel
from tokmem.serve.banks import BankVersion
from tokmem.serve.stream import IncrementalText, StopSequences

log = logging.getLogger(__name__)


class Overloaded(TokMemError):
    """The request queue is full."""


@dataclass
class Request:
    bank: BankVersion
    prompt: list[int]  # the chat-formatted query's token ids
    query: str  # the user's text (for the Generation it becomes)
    max_tokens: int = DecodeConfig.max_new_tokens
    max_steps: int = DecodeConfig.max_steps
    threshold: float = OPEN_SET_THRESHOLD
    temperature: float = DecodeConfig.temperature
    top_p: float = 1.0  # nucleus sampling (temperature > 0)
    seed: int | None = None  # sample from its own generator (the same answer whatever the batch); None: the engine's
    stop: StopSequences = StopSequences()  # a text answer ends before the first of these
    forced: int = -1  # a memory id to start with (routing skipped), or -1
    ignore_eos: bool = False  # go on past EOS up to max_tokens (benchmarks: equal output lengths)
    allowed: torch.Tensor | None = None  # (bank rows,) bool: the memory rows it may use; None: every one
    schema: bool = DecodeConfig.schema  # tool arguments under their schemas, where the bank has them
    grammars: list | None = None  # per bank row, its tool's compiled grammar (the client's schema); None: the bank's
    response: object = None  # the compiled grammar a text answer decodes under from its first token (response_format)
    references: bool = DecodeConfig.references  # schema-bound arguments may be references (off for a chat)
    timeout: float | None = None  # seconds from submission
    begun: int = -1  # the tool whose memory token and its context end the prompt, its arguments next (see Rules)

    def with_context_after(self, memory: int) -> "Request":
        """This request once its first token chose tool ``memory`` of a bank that shows its tools' schemas: the
        prompt goes on with the memory token and its context (tail, schema), the arguments come next,
        and no other call (as ``tokmem.chat``)."""
        after = context_after(self.bank.model, memory)
        return replace(self, prompt=self.prompt + after, begun=memory, max_steps=1, forced=-1)

    def tool_grammars(self) -> list:
        """Per bank row, the compiled grammar its tool's arguments decode under (None: unconstrained)."""
        if not self.schema:
            return [None] * self.bank.rows
        return self.bank.grammars[self.references] if self.grammars is None else self.grammars


class Handle:
    """A submitted request's live state: the engine thread appends tokens, the caller reads them."""

    def __init__(self, request: Request):
        self.request = request
        self.tokens: list[int] = []
        self.plain = False
        self.memory_mass = 0.0
        self.finish_reason: str | None = None  # stop, length, cancelled, timeout or error
        self.error: str | None = None  # what went wrong, when the reason is error
        self.cancelled = False
        self.deadline = None if request.timeout is None else time.monotonic() + request.timeout
        self.generator = None if request.seed is None else _generator(request.seed, request.bank.index.device)
        self.text = IncrementalText(request.bank.model) if request.stop else None  # to find the stop sequences
        self._done = threading.Event()
        self._updated = asyncio.Event()
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    def cancel(self) -> None:
        """Free the row at the next step (the client went away)."""
        self.cancelled = True

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    async def updated(self) -> None:
        """Wait until new tokens arrived or the answer finished (only for handles made in an event loop)."""
        await self._updated.wait()
        self._updated.clear()

    def generation(self) -> Generation:
        """The answer so far, split into segments by ``tokmem.decoding.decode`` (the whole answer decoded: once, at the
        end; streams follow it with ``serve.stream.IncrementalText``)."""
        return to_generation(self.request.bank.model, self.request.query, self.tokens, self.memory_mass, not self.plain)

    def fail(self, message: str) -> None:
        """End the request with an error (the client gets ``message``)."""
        if not self.finished:
            self.error = message
            self._finish("error")

    def _add(self, token: int, eos: int) -> None:
        if self.finished:  # failed this step
            return
        self.tokens.append(token)
        if (token == eos and not self.request.ignore_eos) or self._stopped_by_sequence():
            self._finish("stop")
        elif len(self.tokens) >= self.request.max_tokens:
            self._finish("length")
        else:
            self._notify()

    def lays_out_context_next(self) -> bool:
        """Whether the answer has just chosen a tool whose shown schema is not yet laid out."""
        model = self.request.bank.model
        return (
            not self.finished
            and model.bank.shows_schemas
            and self.request.begun < 0
            and len(self.tokens) == 1
            and starts_calls(model, self.tokens[0], self.plain)
        )

    def _stopped_by_sequence(self) -> bool:
        """Whether the answer is text that has reached one of the request's stop sequences."""
        if self.text is None or starts_calls(self.request.bank.model, self.tokens[0], self.plain):
            return False
        return self.request.stop.end(self.text.update(self.tokens)) is not None

    def _finish(self, reason: str) -> None:
        self.finish_reason = reason
        self._done.set()
        self._notify()

    def _notify(self) -> None:
        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._updated.set)
            except RuntimeError:  # the caller's loop is closed: nobody is listening
                pass


@dataclass
class _Batch:
    """The running rows (``batch.DecodeBatch``), their requests' handles and their banks' tables."""

    handles: list[Handle]
    rows: DecodeBatch
    banks: Banks = field(init=False)  # (rows, widest bank, d): each row its own bank, padded

    def __post_init__(self):
        self.banks = request_tables([h.request for h in self.handles], self.rows.mask.device)

    def __len__(self) -> int:
        return len(self.handles)

    def join(self, other: "_Batch") -> "_Batch":
        return _Batch(self.handles + other.handles, self.rows.join(other.rows, self._join_grammars(other)))

    def select(self, keep: list[int]) -> "_Batch":
        """The rows ``keep``, without the leading columns none of them attends to."""
        return _Batch([self.handles[i] for i in keep], self.rows.select(keep))

    def _join_grammars(self, other: "_Batch") -> ArgumentGrammar | None:
        """The joined rows' grammar: None if neither side has one, else each side's (a side without one gets a blank:
        its rows have no schema in use)."""
        if self.rows.grammar is None and other.rows.grammar is None:
            return None
        mine = self.rows.grammar or argument_grammar([h.request for h in self.handles], always=True)
        theirs = other.rows.grammar or argument_grammar([h.request for h in other.handles], always=True)
        return mine.join(theirs)


def bank_tables(banks: list[BankVersion], device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(index, steer, valid) with one row per batch row: its bank's rows padded to the widest bank (``steer`` to the
    widest input side: a bank's tails come after its rows); ``valid``: the index columns that are rows, not padding."""
    distinct = list({id(b): b for b in banks}.values())
    slot = {id(b): i for i, b in enumerate(distinct)}
    which = torch.tensor([slot[id(b)] for b in banks], device=device)
    index, valid = padded_table([b.index for b in distinct], which)
    steer, _ = padded_table([b.steer for b in distinct], which)
    return index, steer, valid


def padded_table(matrices: list[torch.Tensor], which: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch rows, widest matrix, d): per batch row the matrix ``which`` names, zero-padded, and its valid columns.
    The matrices are stacked once and gathered by a padded index table (one gather, no loop over rows or banks)."""
    device = which.device
    sizes = torch.tensor([len(m) for m in matrices], device=device)
    blank = matrices[0].new_zeros(1, matrices[0].shape[-1])  # what padding columns gather
    stacked = torch.cat(matrices + [blank])
    columns = torch.arange(int(sizes.max()), device=device)
    valid = columns < sizes[which].unsqueeze(-1)
    offsets = sizes.cumsum(0) - sizes
    gather = torch.where(valid, offsets[which].unsqueeze(-1) + columns, len(stacked) - 1)
    return stacked[gather], valid


def request_tables(requests: list[Request], device) -> Banks:
    """``bank_tables`` of the requests' banks, each row's ``valid`` columns also limited to what its request
    allows (one padded tensor, no loop in tensor code), and where their context ids sit."""
    index, steer, valid = bank_tables([r.bank for r in requests], device)
    allowed = [r.allowed.to(device) if r.allowed is not None else valid.new_ones(r.bank.rows) for r in requests]
    context = ContextLayout.of([r.bank.model.bank for r in requests], device)
    return Banks(index, steer, valid & pad_sequence(allowed, batch_first=True), context)


def argument_grammar(requests: list[Request], always: bool = False):
    """The ``ArgumentGrammar`` of a batch of ``requests`` (each row its tool grammars, ``Request.tool_grammars``, and
    its whole-response grammar), all compiled before (so nothing compiles here); None when no row has a grammar to
    decode under, unless ``always``."""
    grammars = [r.tool_grammars() for r in requests]
    responses = [r.response for r in requests]
    if not always and all(grammar is None for row in grammars + [responses] for grammar in row):
        return None
    model = requests[0].bank.model
    return ArgumentGrammar(grammars, model.vocab_size, model.backbone.eos_token_id, responses)


def _generator(seed: int, device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def own_generators(handles: list[Handle]) -> dict[int, torch.Generator]:
    """The rows that sample from their own generator (a request's ``seed``), for ``decode.pick``."""
    return {i: h.generator for i, h in enumerate(handles) if h.generator is not None}


def _fail_broken_rows(handles: list[Handle], logits: torch.Tensor) -> torch.Tensor:
    """Fail the requests whose logits have NaN or +inf (-inf marks masked columns); their rows are zeroed so the
    step goes on for the others, and they leave the batch at the next step."""
    broken = (logits.isnan() | logits.isposinf()).any(-1)
    if broken.any():
        for row in broken.nonzero().flatten().tolist():
            handles[row].fail(
                "the model's output for this request is not a number (NaN/inf); try another bank or settings"
            )
        logits = logits.masked_fill(broken.unsqueeze(-1), 0.0)
    return logits


class Engine:
    """The decoding loop.  ``submit`` from any thread; ``start`` runs ``step`` in a background thread."""

    def __init__(self, backbone: Backbone, max_batch: int = 32, max_queue: int = 256, seed: int = 0):
        self.model = TokMemModel(
            backbone, MemoryBank(backbone.hidden_size)
        )  # the backbone's forward; banks come per row
        if any(layer.is_sliding for layer in DynamicCache(config=self.model.lm.config).layers):
            raise BackboneError(
                f"backbone '{backbone.name}' has sliding-window attention layers, which the server does not batch"
            )
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.generator = torch.Generator(device=backbone.device).manual_seed(seed)
        self.pending: deque[Handle] = deque()
        self.admitting: list[Handle] = []  # left the queue, not yet in the batch
        self.batch: _Batch | None = None
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False

    @property
    def running(self) -> int:
        return len(self.batch) if self.batch is not None else 0

    def submit(self, request: Request) -> Handle:
        handle = Handle(request)
        with self._wake:
            if len(self.pending) >= self.max_queue:
                raise Overloaded(f"the server is busy: {len(self.pending)} requests are already queued; retry later")
            self.pending.append(handle)
            self._wake.notify()
        return handle

    # ---- the loop ----------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> bool:
        """Admit waiting requests, decode one token for every running row; whether work remains."""
        self._drop_stopped()
        self._admit()
        self._drop_stopped()  # rows that ended at their first token
        self._lay_out_context()
        if self.batch is not None:
            self._decode()
        return self.batch is not None or bool(self.pending)

    def start(self) -> None:
        if self._thread is None:
            self._stopping = False
            self._thread = threading.Thread(target=self._run, name="tokmem-engine", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the loop; requests still queued or running end with an error."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._fail_all("the server is shutting down")

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and not self.pending and self.batch is None:
                    self._wake.wait()
                if self._stopping:
                    return
            try:
                self.step()
            except Exception:
                log.exception("decoding step failed; its requests end with an error")
                self._fail_all("the decoding step failed (see the server log)")

    def _fail_all(self, message: str) -> None:
        with self._wake:
            handles = (self.batch.handles if self.batch is not None else []) + self.admitting + list(self.pending)
            self.pending.clear()
        self.batch, self.admitting = None, []
        for handle in handles:
            handle.fail(message)

    # ---- joining and leaving -----------------------------------------------------------------
    def _admit(self) -> None:
        with self._wake:
            free = self.max_batch - self.running
            self.admitting = [self.pending.popleft() for _ in range(min(free, len(self.pending)))]
        new = [h for h in self.admitting if not self._stopped(h)]
        joined = self._prefill_isolated(new) if new else None
        if joined is not None:
            self.batch = joined if self.batch is None else self.batch.join(joined)
        self.admitting = []

    def _lay_out_context(self) -> None:
        """Rows whose first token chose a tool whose memory token is followed by context leave the batch and join it
        again prefilled with the memory token and its context (tail, schema) after their prompt, their arguments next:
        ``tokmem.chat``'s second pass."""
        moving = [i for i, h in enumerate(self.batch.handles) if h.lays_out_context_next()] if self.batch else []
        if not moving:
            return
        handles = [self.batch.handles[i] for i in moving]
        keep = [i for i in range(len(self.batch)) if i not in moving]
        self.batch = self.batch.select(keep) if keep else None
        for handle in handles:
            handle.request = handle.request.with_context_after(handle.tokens[0])
        joined = self._prefill_isolated(handles)
        if joined is not None:
            self.batch = joined if self.batch is None else self.batch.join(joined)

    def _prefill_isolated(self, handles: list[Handle]) -> "_Batch | None":
        """Prefill ``handles`` together; if that fails, one at a time, failing only those that fail alone."""
        try:
            return self._prefill(handles)
        except Exception:
            if len(handles) == 1:
                log.exception("prefill failed; the request ends with an error")
                handles[0].fail("the request could not be prefilled (see the server log)")
                return None
        parts = [part for part in (self._prefill_isolated([h]) for h in handles) if part is not None]
        joined = parts[0] if parts else None
        for part in parts[1:]:
            joined = joined.join(part)
        return joined

    def _prefill(self, handles: list[Handle]) -> _Batch:
        model, device = self.model, self.model.device
        requests = [h.request for h in handles]
        ids, mask = left_pad([r.prompt for r in requests], model.backbone.tokenizer.pad_token_id, device)
        rules = Rules(
            *(
                torch.tensor([getattr(r, name) for r in requests], device=device)
                for name in ("threshold", "forced", "max_steps", "temperature", "top_p", "begun")
            )
        )
        banks = request_tables(requests, device)
        rows, mass = prefill(
            model,
            ids,
            mask,
            DynamicCache(config=model.lm.config),
            banks,
            rules,
            self.generator,
            argument_grammar(requests),
            own_generators(handles),
            functools.partial(_fail_broken_rows, handles),
        )
        for handle, p, m in zip(handles, rows.plain.tolist(), mass.tolist()):
            if handle.request.begun < 0:  # a begun row's routing was its first prefill's
                handle.plain, handle.memory_mass = p, m
        self._record(handles, rows.last)
        return _Batch(handles, rows)

    def _decode(self) -> None:
        batch = self.batch
        generators, check = own_generators(batch.handles), functools.partial(_fail_broken_rows, batch.handles)
        token = step(self.model, batch.rows, batch.banks, self.generator, generators, check=check)
        self._record(batch.handles, token)

    def _record(self, handles: list[Handle], tokens: torch.Tensor) -> None:
        eos = self.model.backbone.eos_token_id
        for handle, token in zip(handles, tokens.tolist()):
            handle._add(token, eos)

    def _drop_stopped(self) -> None:
        """Finish cancelled and timed-out requests (queued or running); finished rows leave the batch."""
        with self._wake:
            self.pending = deque(h for h in self.pending if not self._stopped(h))
        if self.batch is None:
            return
        keep = [i for i, h in enumerate(self.batch.handles) if not self._stopped(h)]
        if len(keep) < len(self.batch):
            self.batch = self.batch.select(keep) if keep else None

    @staticmethod
    def _stopped(handle: Handle) -> bool:
        if not handle.finished and handle.cancelled:
            handle._finish("cancelled")
        if not handle.finished and handle.deadline is not None and time.monotonic() > handle.deadline:
            handle._finish("timeout")
        return handle.finished
