"""Training: only the bank's trainable rows get gradients; the backbone never does.

``train`` fits the rows the bank marks trainable.  ``learn`` is one continual round: procedures the
bank has not seen get new rows, every old row is frozen, the new rows train, then are renormalised
to the old rows' mean norm (unless told not to) and frozen in turn.
"""

from __future__ import annotations

import math
import random
import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from tokmem.data.procedures import Example, tool_procedures
from tokmem.errors import TokMemError
from tokmem.layout import RESULT_TOKENS, Encoded, TruncationCount, collate, encode
from tokmem.model import TokMemModel


INITS = ("mean", "orthogonal")
SCHEDULES = ("constant", "linear")
TOOL_SEGMENTS = ("arguments", "call")


@dataclass
class TrainConfig:
    """Paper defaults: AdamW, lr 5e-3, weight decay 0, one epoch, batch 4, max length 1024."""

    lr: float = 5e-3
    weight_decay: float = 0.0
    epochs: int = 1
    batch_size: int = 4
    grad_accum: int = 1
    max_length: int = 1024
    max_steps: int | None = None
    seed: int = 0
    renormalize: bool = True
    renorm_every_step: bool = False  # also renormalise the new rows after every optimiser step (reference code)
    eps: float = 1e-8
    init: str = "mean"  # new rows: "mean" embedding (the paper's text) or "orthogonal" (the reference code)
    schedule: str = "constant"  # "constant" lr, or "linear": warm-up over ``warmup`` of the steps, then decay to 0
    warmup: float = 0.1
    tool_segments: str = "arguments"  # after a tool's memory token: its "arguments" only (reference code), or the whole "call"
    result_tokens: int = RESULT_TOKENS  # a step's tool result in the sequence is cut to this many tokens
    bf16: bool | None = None  # None: bf16 autocast on CUDA, full precision on CPU
    progress: bool = True
    checkpoint: str | None = None  # save the bank here every ``checkpoint_every`` optimiser steps
    checkpoint_every: int = 0

    def __post_init__(self):
        for field_name, allowed in (("init", INITS), ("schedule", SCHEDULES), ("tool_segments", TOOL_SEGMENTS)):
            if getattr(self, field_name) not in allowed:
                raise TokMemError(f"unknown {field_name} '{getattr(self, field_name)}': choose from {', '.join(allowed)}")
        if not 0 <= self.warmup < 1:
            raise TokMemError(f"warmup is a fraction of the steps, in [0, 1): got {self.warmup}")


@dataclass
class TrainReport:
    steps: int = 0
    examples: int = 0
    tokens: int = 0
    target_tokens: int = 0
    seconds: float = 0.0
    losses: list[float] = field(default_factory=list)
    truncated: TruncationCount = field(default_factory=TruncationCount)
    new_procedures: list[str] = field(default_factory=list)
    renorm_target: float | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def summary(self) -> dict:
        return {
            "steps": self.steps,
            "examples": self.examples,
            "tokens": self.tokens,
            "seconds": round(self.seconds, 2),
            "tokens_per_s": round(self.tokens_per_s, 1),
            "final_loss": self.losses[-1] if self.losses else None,
            "truncated_queries": self.truncated.queries,
            "truncated_responses": self.truncated.responses,
            "new_procedures": self.new_procedures,
            "renorm_target": self.renorm_target,
        }


def learn(model: TokMemModel, examples: list[Example], config: TrainConfig | None = None, descriptions=None,
          param_groups=(), on_step=None, schemas=None) -> TrainReport:
    """One continual round: add the unseen procedures, train only them, renormalise, freeze.

    ``descriptions`` and ``schemas``: name → description / tool JSON schema (a catalog's), kept with the new rows
    (a schema only on a tool row: it binds the arguments decoded after the row's memory token).

    The new rows are renormalised to the old rows' mean norm after the round, and with
    ``renorm_every_step`` after every optimiser step too.  ``param_groups`` and ``on_step``: as in ``fit``.
    """
    config = config or TrainConfig()
    bank = model.bank
    new = [name for name in dict.fromkeys(p for e in examples for p in e.procedures) if name not in bank]
    if not new:
        raise TokMemError("every procedure in these examples is already in the bank: nothing new to learn")
    bank.freeze()
    target = float(bank.norms().mean()) if len(bank) else None
    kinds = row_kinds(new, examples, config)
    rows = bank.add(new, initial_rows(model.backbone, len(new), config.init, config.seed),
                    [(descriptions or {}).get(n, "") for n in new], kinds,
                    [(schemas or {}).get(n) if kind == "tool" else None for n, kind in zip(new, kinds)])

    def after_step(step: int, total: int) -> None:
        if config.renormalize and config.renorm_every_step and target is not None:
            model.renormalize_live_rows(target, config.eps)
        if on_step is not None:
            on_step(step, total)

    report = train(model, examples, config, param_groups, after_step)
    report.new_procedures = new
    if config.renormalize:
        report.renorm_target = bank.renormalize(rows, config.eps)
    bank.freeze()
    return report


def train(model: TokMemModel, examples: list[Example], config: TrainConfig | None = None, param_groups=(), on_step=None) -> TrainReport:
    config = config or TrainConfig()
    _require_trainable_rows(model)  # before laying out: an empty bank cannot encode the procedures
    report = TrainReport()
    tools = model.bank.tool_schemas()
    encoded = [encode(e, model.backbone.tokenizer, model.memory_id, config.max_length, report.truncated, tools, config.result_tokens)
               for e in examples]
    return fit(model, encoded, config, report, on_step=on_step, param_groups=param_groups)


def fit(model: TokMemModel, encoded: list[Encoded], config: TrainConfig | None = None, report: TrainReport | None = None, on_step=None,
        param_groups=()) -> TrainReport:
    """The training loop over sequences already laid out: ``train`` lays them out the TokMem way,
    baselines and studies that place the rows elsewhere bring their own.

    ``on_step(step, total)`` runs after every optimiser step (of ``total``) while the trained rows are live (the model's
    ``loss`` and ``memory_matrices`` see them), e.g. to record an evaluation curve.
    ``param_groups``: more optimiser parameter groups that train alongside the rows (the LoRA weights
    of the adaptation phase, with their own lr); the rows' group takes the config's lr and weight decay.
    """
    config = config or TrainConfig()
    _require_trainable_rows(model)
    _seed(config.seed)
    report = TrainReport() if report is None else report
    order = _order(len(encoded), config)
    step_size = config.batch_size * config.grad_accum
    total = math.ceil(len(order) / step_size)
    params = model.unfreeze_rows()
    optimizer = torch.optim.AdamW([{"params": params}, *param_groups], lr=config.lr, weight_decay=config.weight_decay)
    scheduler = lr_scheduler(optimizer, total, config.schedule, config.warmup)
    autocast = _autocast(model.device, config.bf16)
    bar = tqdm(total=total, desc="training memory", unit="step", disable=not config.progress, dynamic_ncols=True)
    start = time.perf_counter()
    try:
        for first in range(0, total * step_size, step_size):
            chunk = [encoded[i] for i in order[first : first + step_size]]
            loss = _step(model, optimizer, chunk, config, autocast, report)
            scheduler.step()
            report.steps += 1
            report.losses.append(loss)
            report.seconds = time.perf_counter() - start
            bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{report.tokens_per_s:.0f}")
            bar.update()
            if on_step is not None:
                on_step(report.steps, total)
            if config.checkpoint and config.checkpoint_every and report.steps % config.checkpoint_every == 0:
                model.write_rows()
                model.bank.save(config.checkpoint)
    finally:
        bar.close()
        model.commit_rows()
    return report


def row_kinds(names: list[str], examples: list[Example], config: TrainConfig) -> list[str]:
    """Each new procedure's row kind: ``tool`` when every step of it is a call of itself (and the config lays
    out tools' arguments only), else ``text``."""
    tools = tool_procedures(examples) if config.tool_segments == "arguments" else set()
    return ["tool" if name in tools else "text" for name in names]


def initial_rows(backbone, count: int, kind: str = "mean", seed: int = 0) -> torch.Tensor:
    """``count`` new rows: each the mean of the pretrained token embeddings (the paper's text), or
    ``orthogonal`` rows (the reference code's) scaled to the token embeddings' mean L2 norm, so that
    every new memory token starts as distinct as possible at the size of an ordinary token."""
    if kind == "mean":
        return backbone.mean_embedding().expand(count, -1).clone()
    rows = torch.nn.init.orthogonal_(torch.empty(count, backbone.hidden_size), generator=torch.Generator().manual_seed(seed))
    return rows * backbone.embedding_norm()


def lr_scheduler(optimizer, total_steps: int, schedule: str = "constant", warmup: float = 0.1):
    """A constant learning rate, or (``linear``) warm-up over ``warmup`` of the steps and linear decay to 0."""
    from transformers import get_constant_schedule, get_linear_schedule_with_warmup

    if schedule == "constant":
        return get_constant_schedule(optimizer)
    return get_linear_schedule_with_warmup(optimizer, round(warmup * total_steps), total_steps)


def _require_trainable_rows(model: TokMemModel) -> None:
    if not model.bank.trainable.any():
        raise TokMemError("the bank has no trainable rows: add procedures first (or use learn())")


def _step(model, optimizer, chunk, config, autocast, report) -> float:
    """One optimiser step over ``grad_accum`` micro-batches; the loss is averaged over all target tokens."""
    pad = model.backbone.tokenizer.pad_token_id
    micro = [chunk[i : i + config.batch_size] for i in range(0, len(chunk), config.batch_size)]
    batches = [collate(m, pad) for m in micro]
    targets = sum(int((b["labels"][:, 1:] != -100).sum()) for b in batches)
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for batch in batches:
        batch = {k: v.to(model.device) for k, v in batch.items()}
        with autocast:
            loss, count = model.loss(batch)
        (loss * count / targets).backward()
        total += loss.item() * count / targets
        report.tokens += int(batch["attention_mask"].sum())
        report.examples += len(batch["input_ids"])
    report.target_tokens += targets
    optimizer.step()
    return total


def _order(n: int, config: TrainConfig) -> list[int]:
    rng = random.Random(config.seed)
    order = []
    for _ in range(config.epochs):
        epoch = list(range(n))
        rng.shuffle(epoch)
        order += epoch
    if config.max_steps is not None:
        order = order[: config.max_steps * config.batch_size * config.grad_accum]
    return order


def _seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def _autocast(device: torch.device, bf16: bool | None):
    use = device.type == "cuda" if bf16 is None else bf16
    return torch.autocast(device.type, dtype=torch.bfloat16) if use else nullcontext()
