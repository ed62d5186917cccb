"""Training: only the bank's trainable rows get gradients; the backbone never does.

``train`` fits the rows the bank marks trainable.  ``learn`` is one continual round: procedures the
bank has not seen get new rows, every old row is frozen, the new rows train, then are renormalised
to the old rows' mean norm (unless told not to) and frozen in turn.
"""

from __future__ import annotations

import math
import random
import time
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import Literal, get_args

import torch
from tqdm.auto import tqdm

from tokmem.training import distributed
from tokmem.config import option
from tokmem.data import off_topic
from tokmem.data.procedures import Example, tool_procedures
from tokmem.errors import TokMemError
from tokmem.schemas import learned_schema
from tokmem.training.sequences import RESULT_TOKENS, Encoded, TruncationCount, collate, encode, to_device
from tokmem.model import TokMemModel
from tokmem.training.loss import batch_loss
from tokmem.training.prefix_store import PrefixStore, default_budget
from tokmem.training.refit import fit_model_key_sets, refit_index, routing_states
from tokmem.training.train_state import TrainingState


Init = Literal["mean", "orthogonal", "name"]
Schedule = Literal["constant", "linear"]
ToolSegments = Literal["arguments", "call"]
KeyOrder = Literal["calls", "schema", "given"]
RenormTarget = Literal["old_rows", "tokens"]
RenormSide = Literal["index", "steer"]
INITS, SCHEDULES, TOOL_SEGMENTS = get_args(Init), get_args(Schedule), get_args(ToolSegments)
KEY_ORDERS, RENORM_TARGETS, RENORM_SIDES = get_args(KeyOrder), get_args(RenormTarget), get_args(RenormSide)
LOSS_WEIGHTS = ("choice_weight", "route_weight")  # TrainConfig's weights of some labels in the loss, 1 by default
RENORM_SETTINGS = ("renormalize", "renorm_every_step", "renorm_target", "renorm_side")  # how new rows are rescaled


@dataclass
class TrainConfig:
    """The paper's defaults (AdamW, lr 5e-3, weight decay 0, one epoch, batch 4, max length 1024), grouped by concern;
    ``tokmem train`` lays its own recipe over them (``PICKED_RECIPE``)."""

    # the optimiser and its budget
    lr: float = option(5e-3, "learning rate of the memory rows")
    weight_decay: float = option(0.0, "AdamW weight decay of the memory rows")
    schedule: Schedule = option(
        "constant",
        "learning rate: constant, or linear (warm-up over --warmup of the steps, then decay to 0; the reference code)",
        flag="--lr-schedule",
    )
    warmup: float = option(0.1, "warm-up fraction of the linear schedule")
    epochs: int = option(1, "passes over the training examples")
    batch_size: int = option(4, "examples per micro-batch")
    grad_accum: int = option(1, "micro-batches per optimiser step")
    max_steps: int | None = option(None, "stop after this many optimiser steps")
    seed: int = option(0, "seed of the data order and the new rows")

    # the training sequences and their loss
    max_length: int = option(
        1024, "longest training sequence in tokens (a longer one loses its query's start, then its targets' end)"
    )
    tool_segments: ToolSegments = option(
        "arguments", "after a tool's memory token: its arguments only (the reference code) or the whole call"
    )
    key_order: KeyOrder = option(
        "calls",
        "the order a tool row's arguments are trained and decoded in: the training calls' (calls), its catalog "
        "schema's (schema), or each call's own, decoded in any order the calls wrote (given)",
    )
    result_tokens: int = option(RESULT_TOKENS, "a step's tool result in the sequence is cut to this many tokens")
    negatives: float = option(
        0.0,
        "off-topic queries added per training example (tokmem.data.off_topic; none that shares a word with a "
        "procedure's name or description), each trained to leave the query to the plain backbone: the open set",
    )
    near_misses: bool = option(
        False,
        "make up to half the negatives near misses: queries that name the procedures' own words but ask for none of "
        "them (\"Tell me a joke about the word 'currency'.\"; tokmem.data.off_topic.near_misses)",
    )
    choice_weight: float = option(
        1.0,
        "loss weight of the few argument tokens where a call decides which keys it carries (a value's end that goes "
        "on to another key or closes the object, and the next key's first token); the others weigh 1",
    )
    route_weight: float = option(
        1.0,
        "loss weight of the memory-token labels (which procedure or tool comes next: the routing), the others weigh "
        "1: a call has one such label among the dozens of its arguments",
    )
    segment_backprop: bool = option(
        False,
        "tool loops: back-propagate each labelled segment (a memory token and its arguments) on its own, attending "
        "to the record's states before it computed without gradients: the tool results are read, never "
        "back-propagated (an approximation; exact with one segment a record)",
    )

    # the new rows: how they start, and their norm after training
    init: Init = option(
        "mean",
        "new rows: the mean embedding (the paper's text), orthogonal (the reference code), or name (the mean embedding "
        "of the procedure's own name and description tokens, at an ordinary token's norm)",
    )
    renormalize: bool = option(
        True, "renormalise the new rows to the old rows' mean norm after the round", flag="--renorm"
    )
    renorm_every_step: bool = option(
        False, "renormalise the new rows after every optimiser step too (the reference code)"
    )
    renorm_target: RenormTarget = option(
        "old_rows",
        "the norm new rows are renormalised to: the old rows' mean (the paper's; a first round has none, so no "
        "renormalisation) or an ordinary token's (the backbone's mean embedding norm, where the reference code's "
        "reserved rows stand)",
    )
    renorm_side: RenormSide = option(
        "index",
        "the matrix of a decoupled bank renormalisation rescales: index (what routing scores; the paper's) or steer "
        "(what generation reads; the index rows then grow freely); a coupled bank's one matrix is both",
    )
    eps: float = 1e-8

    # after training: fits on the states the trained rows' examples reach (tokmem.training.refit)
    refit_index: bool = option(
        False,
        "after training, refit the new rows' routing side on the states their training examples reach, and keep "
        "the bank decoupled (its trained rows steer): one pass of the backbone, no gradients through it "
        "(tokmem.training.refit)",
    )
    key_sets: bool = option(
        False,
        "after training, give each new tool whose training calls write several key sets a row per key set, fitted on "
        "the states that route it, and decode its arguments bound to the key set its routing state chooses "
        "(tokmem.training.refit)",
    )
    threshold: float | None = option(
        None,
        "the open-set threshold the bank decodes with unless a caller gives one, kept in the bank (none: the bank's, "
        "else 0.5)",
    )

    # the system: batching, precision, memory, processes
    length_grouped: bool = option(
        False, "batch sequences of similar length together (less padding; each epoch still shuffled)"
    )
    bf16: bool | None = option(None, "bf16 autocast (default: on CUDA only)")
    prefix_cache_gib: float | None = option(
        None,
        "memory for the query prefixes' KV states, kept from one epoch to the next (GiB; default: a quarter of the "
        "memory free when training starts; 0: none, each epoch encodes them again)",
    )
    fsdp: bool = option(
        False,
        "under torchrun / accelerate: shard the frozen backbone's decoder layers across the processes (FSDP2), "
        "for a backbone that does not fit one device",
    )

    # the run: progress, checkpoints, resuming
    progress: bool = True
    checkpoint: str | None = None  # save the bank here every ``checkpoint_every`` optimiser steps
    checkpoint_every: int = option(
        0, "save the bank every N optimiser steps, and beside it what --resume needs to go on from there"
    )
    resume: bool = option(
        False,
        "go on from the last checkpoint of an interrupted training with the same settings and data (the rows, the "
        "optimiser and the schedule where they were), to the result an uninterrupted one gives",
    )

    def __post_init__(self):
        allowed_values = (
            ("init", INITS),
            ("schedule", SCHEDULES),
            ("tool_segments", TOOL_SEGMENTS),
            ("key_order", KEY_ORDERS),
            ("renorm_target", RENORM_TARGETS),
            ("renorm_side", RENORM_SIDES),
        )
        for field_name, allowed in allowed_values:
            if getattr(self, field_name) not in allowed:
                raise TokMemError(
                    f"unknown {field_name} '{getattr(self, field_name)}': choose from {', '.join(allowed)}"
                )
        for field_name in LOSS_WEIGHTS:
            if not getattr(self, field_name) > 0:
                raise TokMemError(f"{field_name} is a loss weight, above 0: got {getattr(self, field_name)}")
        if self.threshold is not None and not 0 <= self.threshold <= 1:
            raise TokMemError(f"threshold is a memory mass, from 0 to 1: got {self.threshold}")
        if not self.negatives >= 0:
            raise TokMemError(
                f"negatives is a number of off-topic queries per example, 0 or more: got {self.negatives}"
            )
        if not 0 <= self.warmup < 1:
            raise TokMemError(f"warmup is a fraction of the steps, in [0, 1): got {self.warmup}")
        if self.resume and not (self.checkpoint and self.checkpoint_every):
            raise TokMemError("resume goes on from the checkpoints checkpoint_every saves to checkpoint: give both")
        if self.resume and self.fsdp:
            raise TokMemError("resume does not load a sharded (fsdp) training's state: train without fsdp")


@dataclass
class TrainReport:
    steps: int = 0
    examples: int = 0
    tokens: int = 0
    positions: int = 0  # of the collated batches, padding included
    target_tokens: int = 0
    seconds: float = 0.0
    losses: list[float] = field(default_factory=list)
    truncated: TruncationCount = field(default_factory=TruncationCount)
    new_procedures: list[str] = field(default_factory=list)
    renorm_target: float | None = None
    prefix_cache_bytes: int = 0
    refit: dict | None = None  # ``refit_index``'s: the training calls routed right before and after
    key_sets: dict | None = None  # ``key_sets``': the tools and key sets fitted, the training calls chosen right
    negatives: int = 0  # ``negatives``: the off-topic queries trained beside the examples
    resumed_from: int = 0  # ``resume``: the steps an interrupted run had taken (their seconds are in ``seconds``)

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
            "truncated_sequences": self.truncated.sequences,
            "truncated_queries": self.truncated.queries,
            "truncated_responses": self.truncated.responses,
            "new_procedures": self.new_procedures,
            "renorm_target": self.renorm_target,
            "prefix_cache_bytes": self.prefix_cache_bytes,
            "refit": self.refit,
            "key_sets": self.key_sets,
            "negatives": self.negatives,
            "resumed_from_step": self.resumed_from,
        }


# ``tokmem train``'s recipe when no flag sets it: what routed and called best for a user's few tools (docs/results.md;
# docs/tools.md, "Routing refit after training", "Key-set rows", "The open set").
NEGATIVES, THRESHOLD = 1.0, 0.8  # off-topic queries per example and the bank's open-set threshold: the open set
PICKED_RECIPE = {
    "lr": 2e-2,
    "schedule": "linear",
    "refit_index": True,
    "key_sets": True,
    "negatives": NEGATIVES,
    "threshold": THRESHOLD,
}
UPDATES_PER_ROW = 50  # the least optimiser steps per new row: few tools need several epochs (the travel example)


def picked_config(examples: list[Example], new_rows: int, **given) -> TrainConfig:
    """``tokmem train``'s config: the options ``given`` (those not None), and where ``lr``, ``schedule`` or
    ``epochs`` is not given, the picked recipe and budget (``PICKED_RECIPE``, a layer over ``TrainConfig``'s paper
    defaults, and ``picked_epochs``)."""
    given = {name: value for name, value in given.items() if value is not None}
    config = TrainConfig(**(PICKED_RECIPE | given))
    if "epochs" in given:
        return config
    trained = round(len(examples) * (1 + config.negatives))  # the off-topic queries take their share of the steps
    return replace(config, epochs=picked_epochs(trained, new_rows, config.batch_size * config.grad_accum))


def picked_epochs(examples: int, new_rows: int, step_size: int) -> int:
    """Passes over ``examples`` that make at least ``UPDATES_PER_ROW`` optimiser steps (of ``step_size`` examples)
    per new row: a few tools with a hundred examples get several epochs, a large data set one.  The epochs run as
    one stream of batches (``example_order``), so the steps are the examples of all epochs over ``step_size``."""
    return max(1, math.ceil(UPDATES_PER_ROW * new_rows * step_size / examples))


def learn(
    model: TokMemModel,
    examples: list[Example],
    config: TrainConfig | None = None,
    descriptions=None,
    param_groups=(),
    on_step=None,
    schemas=None,
) -> TrainReport:
    """One continual round: add the unseen procedures, train only them, renormalise, freeze.

    ``descriptions`` and ``schemas``: name → description / tool JSON schema (a catalog's), kept with the new rows
    (a schema only on a tool row: it binds the arguments decoded after the row's memory token; its string arguments
    get bounds learned from these examples' values and its properties their calls' order, ``schemas.learned_schema``).

    The new rows are renormalised to the old rows' mean norm after the round, and with
    ``renorm_every_step`` after every optimiser step too.  The round's renormalisation comes after ``refit_index``'s
    refit, on purpose: the refit fits the routing rows' directions on this round's examples alone, and the
    renormalisation then sets their norm, so that new rows do not outscore the old ones on the old rows' queries by
    their norm (``tokmem add`` keeps a bank's new rows at its old rows' mean).  ``param_groups`` and ``on_step``: as
    in ``fit``.
    """
    config = config or TrainConfig()
    bank = model.bank
    new = [name for name in dict.fromkeys(p for e in examples for p in e.procedures) if name not in bank]
    if not new:
        raise TokMemError("every procedure in these examples is already in the bank: nothing new to learn")
    bank.freeze()
    target = renorm_target(model, config)
    kinds = row_kinds(new, examples, config)
    rows = bank.add(
        new,
        initial_rows(model.backbone, row_texts(new, descriptions), config.init, config.seed),
        [(descriptions or {}).get(n, "") for n in new],
        kinds,
        [
            learned_schema((schemas or {}).get(n), n, examples, config.key_order) if kind == "tool" else None
            for n, kind in zip(new, kinds)
        ],
    )

    def after_step(step: int, total: int) -> None:
        if config.renormalize and config.renorm_every_step and target is not None:
            model.renormalize_live_rows(target, config.eps, config.renorm_side)
        if on_step is not None:
            on_step(step, total)

    count = round(config.negatives * len(examples))
    added = off_topic.negatives(count, config.seed, bank.names, bank.descriptions, config.near_misses)
    report = train(model, [*examples, *added], config, param_groups, after_step)
    report.new_procedures, report.negatives = new, len(added)
    if config.threshold is not None:
        bank.threshold = config.threshold
    if config.renormalize and target is not None:
        report.renorm_target = bank.renormalize(rows, config.eps, target, config.renorm_side)
    bank.freeze()
    return report


def renorm_target(model: TokMemModel, config: TrainConfig) -> float | None:
    """The L2 norm a round's new rows are renormalised to (``TrainConfig.renorm_target``), before they are added:
    the old rows' mean (None without old rows) or the backbone's mean token-embedding norm."""
    if config.renorm_target == "tokens":
        return model.backbone.embedding_norm()
    return float(model.bank.norms(config.renorm_side).mean()) if len(model.bank) else None


def train(
    model: TokMemModel, examples: list[Example], config: TrainConfig | None = None, param_groups=(), on_step=None
) -> TrainReport:
    """Fit the bank's trainable rows on ``examples`` (laid out by ``encode_examples``); with ``refit_index``, then
    refit their index side on the states those examples reach (``tokmem.training.refit``), and with ``key_sets`` fit
    their key-set rows on the same states (``tokmem.training.refit``).  ``param_groups`` and ``on_step``: as in
    ``fit``."""
    config = config or TrainConfig()
    _require_trainable_rows(model)  # before laying out: an empty bank cannot encode the procedures
    report = TrainReport()
    encoded = encode_examples(model, examples, config, report.truncated)
    fit(model, encoded, config, report, on_step=on_step, param_groups=param_groups)
    if config.refit_index or config.key_sets:
        progress, start = config.progress and distributed.is_main(), time.perf_counter()
        found = routing_states(model, encoded, config.batch_size, progress)  # the trained steer rows', as decoded
        if config.refit_index:
            report.refit = refit_index(model, found) | {"seconds": round(time.perf_counter() - start, 2)}
        if config.key_sets:
            report.key_sets = fit_model_key_sets(model, found, encoded)
    return report


def encode_examples(
    model: TokMemModel, examples: list[Example], config: TrainConfig, truncated: TruncationCount | None = None
) -> list[Encoded]:
    """``examples`` laid out the TokMem way for ``model``'s bank, as ``config`` cuts them."""
    tools = model.bank.tool_schemas()
    return [
        encode(
            e,
            model.backbone.tokenizer,
            model.memory_id,
            config.max_length,
            truncated,
            tools,
            config.result_tokens,
            model.bank.shows_schemas,
            model.tail_ids,
        )
        for e in examples
    ]


def fit(
    model: TokMemModel,
    encoded: list[Encoded],
    config: TrainConfig | None = None,
    report: TrainReport | None = None,
    on_step=None,
    param_groups=(),
    steps: list[list[int]] | None = None,
) -> TrainReport:
    """The training loop over sequences already laid out: ``train`` lays them out the TokMem way,
    baselines and studies that place the rows elsewhere bring their own.

    ``on_step(step, total)`` runs after every optimiser step (of ``total``) while the trained rows are live
    (``batch_loss`` and the model's ``memory_matrices`` see them), e.g. to record an evaluation curve.
    ``param_groups``: more optimiser parameter groups that train alongside the rows (LoRA weights, with their own lr);
    the rows' group takes the config's lr and weight decay.  A model without trainable rows trains the groups alone.
    ``steps``: the indices into ``encoded`` of each optimiser step, for a caller that composes its batches itself
    (replay adds old examples to each); default: ``epoch_order`` in steps of batch size × ``grad_accum``.
    An example that comes again (a later epoch) reuses its query prefix's states from the first time (``prefix_store``).
    """
    config = config or TrainConfig()
    if not param_groups:
        _require_trainable_rows(model)
    _seed(config.seed)
    if config.fsdp:
        _shard_backbone(model, param_groups)
    distributed.start(model.device)
    report = TrainReport() if report is None else report
    steps = steps if steps is not None else _steps([len(e.input_ids) for e in encoded], config)
    total = len(steps)
    prefixes = prefix_store(model, config, steps)
    rows = model.unfreeze_rows() if model.bank.trainable.any() else []
    optimizer, scheduler = optimizer_and_schedule([*([{"params": rows}] if rows else []), *param_groups], config, total)
    checkpointed = config.checkpoint and config.checkpoint_every
    state = TrainingState.of(config, steps, encoded, optimizer, scheduler) if checkpointed else None
    done = report.resumed_from = state.restore(report) if config.resume else 0
    quiet = not (config.progress and distributed.is_main())
    bar = tqdm(total=total, initial=done, desc="training memory", unit="step", disable=quiet, dynamic_ncols=True)
    start = time.perf_counter() - report.seconds
    try:
        for step in steps[done:]:
            chunk = distributed.shard([encoded[i] for i in step])
            loss = _step(model, optimizer, chunk, config, report, encoded[step[0]], prefixes)
            scheduler.step()
            report.steps += 1
            report.losses.append(loss)
            report.seconds = time.perf_counter() - start
            bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{report.tokens_per_s:.0f}")
            bar.update()
            _checkpoint(model, config, report, state)
            if on_step is not None:
                on_step(report.steps, total)
    finally:
        bar.close()
        report.prefix_cache_bytes = prefixes.used if prefixes else 0
        if rows:
            model.commit_rows()
    return report


def _checkpoint(model: TokMemModel, config: TrainConfig, report: TrainReport, state: TrainingState | None) -> None:
    """Every ``checkpoint_every`` steps (by the main process): the bank saved to ``config.checkpoint``, and beside
    it the training state ``resume`` goes on from."""
    if state and report.steps % config.checkpoint_every == 0:
        model.write_rows()
        if distributed.is_main():
            model.bank.save(config.checkpoint)
        state.save(report)


def prefix_store(model: TokMemModel, config: TrainConfig, steps: list[list[int]]) -> PrefixStore | None:
    """Where the query prefixes' states are kept for the examples that come again (a later epoch): nowhere when none
    does, with a zero budget, or under ``fsdp`` (every rank must run the same passes, and the ranks' stores differ)."""
    order = [i for step in steps for i in step]
    if config.fsdp or config.prefix_cache_gib == 0 or len(set(order)) == len(order):
        return None
    if config.prefix_cache_gib is None:
        return PrefixStore(default_budget(model.device))
    return PrefixStore(int(config.prefix_cache_gib * 2**30))


def row_kinds(names: list[str], examples: list[Example], config: TrainConfig) -> list[str]:
    """Each new procedure's row kind: ``tool`` when every step of it is a call of itself (and the config lays
    out tools' arguments only), else ``text``."""
    tools = tool_procedures(examples) if config.tool_segments == "arguments" else set()
    return ["tool" if name in tools else "text" for name in names]


def row_texts(names: list[str], descriptions: dict[str, str] | None = None) -> list[str]:
    """What each new row is named for: its procedure's name in words and, where the catalog has one, its
    description (``get_weather`` → "get weather: Current weather in a city.")."""
    words = [name.replace("_", " ").replace("-", " ") for name in names]
    return [f"{w}: {d}" if (d := (descriptions or {}).get(n)) else w for n, w in zip(names, words)]


def initial_rows(backbone, texts: list[str], kind: str = "mean", seed: int = 0) -> torch.Tensor:
    """A new row for each of ``texts`` (``row_texts``): the mean of the pretrained token embeddings (the paper's
    text); ``orthogonal`` rows (the reference code's) scaled to the token embeddings' mean L2 norm, so that every new
    memory token starts as distinct as possible at the size of an ordinary token; or (``name``) the mean embedding of
    the row's own text's tokens at that norm, so that each row starts near the words that name its procedure, as
    an input (steering) and as an output (routing: a hidden state about the weather already points at it)."""
    if kind == "mean":
        return backbone.mean_embedding().expand(len(texts), -1).clone()
    if kind == "name":
        rows = torch.stack([backbone.text_embedding(text) for text in texts])
        return rows / rows.norm(dim=1, keepdim=True) * backbone.embedding_norm()
    rows = torch.nn.init.orthogonal_(
        torch.empty(len(texts), backbone.hidden_size), generator=torch.Generator().manual_seed(seed)
    )
    return rows * backbone.embedding_norm()


def optimizer_and_schedule(groups, config: TrainConfig, total_steps: int):
    """AdamW over ``groups`` (parameters or param groups) at the config's lr and weight decay, and the config's lr
    schedule over ``total_steps``."""
    optimizer = torch.optim.AdamW(groups, lr=config.lr, weight_decay=config.weight_decay)
    return optimizer, lr_scheduler(optimizer, total_steps, config.schedule, config.warmup)


def lr_scheduler(optimizer, total_steps: int, schedule: str = "constant", warmup: float = 0.1):
    """A constant learning rate, or (``linear``) warm-up over ``warmup`` of the steps and linear decay to 0."""
    from transformers import get_constant_schedule, get_linear_schedule_with_warmup

    if schedule == "constant":
        return get_constant_schedule(optimizer)
    return get_linear_schedule_with_warmup(optimizer, round(warmup * total_steps), total_steps)


def _require_trainable_rows(model: TokMemModel) -> None:
    if not model.bank.trainable.any():
        raise TokMemError("the bank has no trainable rows: add procedures first (or use learn())")


def _step(model, optimizer, chunk, config, report, filler: Encoded, prefixes: PrefixStore | None) -> float:
    """One optimiser step over ``grad_accum`` micro-batches of ``batch_size`` (this rank's share of the step, under
    a launcher); the loss is averaged over all target tokens of the step, on every rank.  Without accumulation the
    step is one batch, whatever its size (replay adds examples to a batch).  With the backbone's layers sharded,
    a rank with fewer micro-batches than another runs ``filler`` at weight 0 for each missing one.  ``prefixes``:
    where the query prefixes' states are kept across epochs (``prefix_store``)."""
    pad = model.backbone.tokenizer.pad_token_id
    size = config.batch_size if config.grad_accum > 1 else max(len(chunk), 1)
    batches = [collate(chunk[i : i + size], pad) for i in range(0, len(chunk), size)]
    local_targets = sum(int((b["labels"][:, 1:] != -100).sum()) for b in batches)
    targets = distributed.global_sum(local_targets, model.device)
    weights = [1.0] * len(batches)
    if distributed.layers_sharded(model.lm):
        missing = distributed.global_max(len(batches), model.device) - len(batches)
        batches, weights = batches + [collate([filler], pad)] * missing, weights + [0.0] * missing
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for batch, weight in zip(batches, weights):
        batch = to_device(batch, model.device)
        with step_context(model.device, config.bf16):
            loss, count = batch_loss(
                model, batch, prefixes, config.segment_backprop, config.choice_weight, config.route_weight
            )
        (loss * (weight * count / targets)).backward()
        total += weight * loss.item() * count / targets
        report.tokens += int(weight * batch["attention_mask"].sum())
        report.positions += int(weight * batch["attention_mask"].numel())
        report.examples += int(weight * len(batch["input_ids"]))
    report.target_tokens += local_targets
    distributed.sum_gradients([p for group in optimizer.param_groups for p in group["params"]])
    optimizer.step()
    return distributed.global_sum(total, model.device)


def _shard_backbone(model: TokMemModel, param_groups) -> None:
    """``TrainConfig.fsdp``: the backbone's decoder layers sharded across the launcher's processes, then moved to
    each process's device (its GPU, or the CPU)."""
    from tokmem.backbones import default_device

    if param_groups:
        raise TokMemError(
            "fsdp shards a frozen backbone: weights that train inside it (LoRA, the adaptation phase) cannot be "
            "sharded this way; adapt with one whole backbone a process"
        )
    device = torch.device(default_device())
    distributed.start(device)
    distributed.shard_layers(model.lm, device)


def epoch_order(n: int, epochs: int, seed) -> list[int]:
    """``epochs`` passes over ``n`` examples, each shuffled by one generator seeded with ``seed`` (any hashable)."""
    rng = random.Random(seed)
    order = []
    for _ in range(epochs):
        epoch = list(range(n))
        rng.shuffle(epoch)
        order += epoch
    return order


def example_order(lengths: list[int], config: TrainConfig) -> list[int]:
    """The examples' order over all epochs: ``epoch_order``, or with ``length_grouped`` batches of similar length
    (see ``length_grouped_order``)."""
    if not config.length_grouped:
        return epoch_order(len(lengths), config.epochs, config.seed)
    generators = (torch.Generator().manual_seed(config.seed + epoch) for epoch in range(config.epochs))
    return [i for generator in generators for i in length_grouped_order(lengths, config.batch_size, generator)]


def length_grouped_order(
    lengths: list[int], batch_size: int, generator: torch.Generator, window: int = 50
) -> list[int]:
    """One epoch in batches of similar length, so that little of a step is padding.

    Shuffle, sort each window of ``window`` batches by length, cut it into batches, then shuffle the
    batches, so that the order of lengths (and of procedures, which lengths often follow) stays random.
    """
    shuffled = torch.randperm(len(lengths), generator=generator).tolist()
    batches = []
    for start in range(0, len(shuffled), window * batch_size):
        ranked = sorted(shuffled[start : start + window * batch_size], key=lengths.__getitem__)
        batches += [ranked[i : i + batch_size] for i in range(0, len(ranked), batch_size)]
    return [i for b in torch.randperm(len(batches), generator=generator).tolist() for i in batches[b]]


def _steps(lengths: list[int], config: TrainConfig) -> list[list[int]]:
    """Each optimiser step's examples: batch size × accumulation × processes (each rank takes its share)."""
    order = example_order(lengths, config)
    step_size = config.batch_size * config.grad_accum * distributed.world_size()
    if config.max_steps is not None:
        order = order[: config.max_steps * step_size]
    return [order[i : i + step_size] for i in range(0, len(order), step_size)]


def _seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def step_context(device: torch.device, bf16: bool | None = None) -> ExitStack:
    """What a training step runs under: bf16 autocast where asked (``None``: on CUDA) and, on CUDA,
    attention without cuDNN's fused kernel: cuDNN builds an execution plan for every new shape, and training batches
    come in many shapes (docs/scale.md, "The GPU path").  Flash and memory-efficient attention have no such cost."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    stack = ExitStack()
    if device.type == "cuda" if bf16 is None else bf16:
        stack.enter_context(torch.autocast(device.type, dtype=torch.bfloat16))
    if device.type == "cuda":
        stack.enter_context(sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]))
    return stack
