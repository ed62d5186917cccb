"""Memory placement: TokMem's infix memory vs prefix tuning (the paper's "Analysis on Memory Placement").

With routing switched off TokMem is prompt tuning with an *infix* placement, where prefix tuning
places the same trainable embeddings before the query:

    TokMem-n          chat(query)  M_1 … M_n  response
    Prefix tuning-n   P_1 … P_n  chat(query)  response

Both train n rows initialised to the mean input embedding, with the same optimiser, data, order
and steps.  TokMem-n is n consecutive memory tokens of one procedure: bank rows ``text#0`` … forced
after the query.  The memory tokens are inputs here, not targets (there is nothing to route to),
so in both methods only the response is a target.  The rows of TokMem stay output classes of its
LM head as always (on smollm2-135m they hold ~1e-7 of the probability at the text positions, so
perplexities compare), prefix rows never are (`tokmem.methods.prefix`).

Two studies, each a function returning a result dict:

* memorisation (`run_memorization`): compress text the backbone cannot have seen (by default the
  paper's own LaTeX source, written after the default backbone was trained) into n rows.  Each seed
  takes a random stretch of ``text_tokens`` tokens, cut into sequences of ``sequence_length`` (128), each after its
  own random query that only marks the placement.  Every optimiser step covers the whole text; the
  text's perplexity is evaluated every ``eval_every`` steps.  Reported: the final perplexity and
  Steps@90%Best (`steps_at_90`), averaged over seeds, with the mean curves.
* GSM8K format compliance (`run_gsm8k`), as the authors' reference code runs it: train prefix
  tuning and TokMem (one token) on 20% and 100% of a training subset for 3 epochs, score a held-out
  validation split after each epoch and keep the rows of the best epoch (exact match, then
  compliance), then generate answers for a test subset.  Reported: compliance (the reference rule:
  ``#### `` anywhere in the answer), strict compliance (the answer ends with ``#### <number>``) and
  exact match of the normalised final number.  The ``reference`` layout frames the problem as the
  reference code does and puts TokMem's token between the user turn and the assistant header:

      TokMem          user("question: {q}")  M  assistant-header  "answer: {solution}" EOS
      Prefix tuning   P  user("question: {q}")  assistant-header  "answer: {solution}" EOS

  The ``assistant`` layout (this study's first one) puts M after the assistant header, with the bare
  question and solution.

`add_parser` adds the ``placement`` subcommand (``tokmem bench placement``).
"""

from __future__ import annotations

import copy
import json
import math
import random
import string
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import torch
from tqdm.auto import tqdm

import tokmem
from tokmem.eval import metrics
from tokmem.backbones import Backbone, backbone_option, device_option, load_backbone
from tokmem.methods import prefix
from tokmem.config import option
from tokmem.data.gsm8k import Problem, gsm8k_compliant, gsm8k_strictly_compliant, load_gsm8k
from tokmem.data.shared import shared_data
from tokmem.decode import DecodeConfig, complete
from tokmem.errors import DataError, TokMemError
from tokmem.io import write_json_atomic, write_text_atomic
from tokmem.studies.harness import resumed
from tokmem.studies.outputs import Panel, line_plot, markdown_table
from tokmem.sequences import IGNORE, Encoded, chat_prefix, chat_turns, collate
from tokmem.model import TokMemModel
from tokmem.report import machine
from tokmem.train import TrainConfig, fit

METHODS = ("prefix", "tokmem")
LABELS = {"prefix": "Prefix tuning", "tokmem": "TokMem"}


# ---- the two placements --------------------------------------------------------------------------
def build(method: str, tokens: int, backbone: Backbone, name: str = "text") -> TokMemModel:
    """A fresh model with ``tokens`` trainable rows: a prefix, or TokMem rows ``name#0`` …."""
    if method == "prefix":
        return prefix.create(backbone, tokens)
    model = tokmem.create(backbone)
    model.bank.add(prefix.row_names(name, tokens), backbone.mean_embedding())
    return model


def context(model: TokMemModel, method: str, query: str, layout: str = "assistant") -> list[int]:
    """What comes before the target: prefix tuning's P ⊕ chat(query) in either layout; TokMem's
    chat(query) ⊕ M (``assistant``: after the assistant header) or user turn ⊕ M ⊕ assistant header (``reference``)."""
    if method == "prefix":
        return prefix.context(model, query)
    tokenizer = model.backbone.tokenizer
    memory = [model.memory_id(n) for n in model.bank.names]
    if layout == "reference":
        turn, header = chat_turns(tokenizer, query)
        return turn + memory + header
    return chat_prefix(tokenizer, query) + memory


def lay_out(model: TokMemModel, method: str, query: str, target: list[int], layout: str = "assistant") -> Encoded:
    """The method's sequence for one (query, target) pair; only the target is labelled."""
    return _targeted(context(model, method, query, layout), target)


def _targeted(before: list[int], target: list[int]) -> Encoded:
    return Encoded(before + target, [IGNORE] * len(before) + target)


@torch.no_grad()
def perplexity(model: TokMemModel, encoded: list[Encoded], batch_size: int) -> float:
    """Perplexity of the labelled tokens of ``encoded`` under the model (its live rows while training)."""
    pad = model.backbone.tokenizer.pad_token_id
    nll, count = 0.0, 0
    for start in range(0, len(encoded), batch_size):
        batch = collate(encoded[start : start + batch_size], pad)
        loss, n = model.loss({k: v.to(model.device) for k, v in batch.items()})
        nll, count = nll + loss.item() * n, count + n
    return metrics.perplexity(nll, count)


def steps_at_90(steps: list[int], perplexities: list[float], fraction: float = 0.9) -> int:
    """Steps@90%Best: the first evaluated step at which the run is within 90% of its best perplexity.

    Perplexity is lower-is-better, so a perplexity p reaches the fraction x of the best (lowest) one
    b when b / p ≥ x, i.e. p ≤ b / x: with x = 0.9 the run is at most 11.1% above its best.  This
    reads the paper's "training steps needed to reach 90% of the lowest achieved perplexity" as a
    ratio of perplexities.  ``steps`` are the evaluated steps in order (step 0, before training,
    included when it was evaluated); the best is the lowest perplexity of the whole curve.
    """
    if not steps or len(steps) != len(perplexities):
        raise ValueError(
            f"need one perplexity per evaluated step, got {len(steps)} steps and {len(perplexities)} values"
        )
    threshold = min(perplexities) / fraction
    return next(step for step, p in zip(steps, perplexities) if p <= threshold)


# ---- memorisation ------------------------------------------------------------------------------------
@dataclass
class MemorizationConfig:
    """Defaults are the paper's setup (its batches of 8–32 sequences are the whole text at each step)."""

    backbone: str = backbone_option()
    text: str = option(str(shared_data().parent / "paper" / "tokmem.tex"), "memorization: the text file to memorise")
    text_tokens: tuple[int, ...] = option((1024, 2048, 4096), "memorization: tokens of the text memorised, per setting")
    memory_tokens: tuple[int, ...] = option((1, 2, 5), "memorization: trainable rows, per setting")
    sequence_length: int = option(128, "memorization: tokens per training sequence")
    steps: int = option(3000, "memorization: optimiser steps per run")
    eval_every: int = option(100, "memorization: steps between perplexity measurements")
    seeds: int = option(5, "memorization: runs to average over")
    lr: float = option(TrainConfig.lr, "learning rate of the rows")
    batch_size: int = option(8, "sequences per forward pass (memorization: one optimiser step covers the whole text)")
    device: str | None = device_option()
    progress: bool = True


def run_memorization(config: MemorizationConfig) -> dict:
    """Memorise ``text_tokens`` tokens of the text into each method's rows; perplexity curves per seed.

    ``ppl_before`` is the backbone's own perplexity of the same sequences (no memory, no training),
    averaged over seeds and text sizes.
    """
    _check_memorization(config)
    start = time.perf_counter()
    backbone = load_backbone(config.backbone, device=config.device)
    text = _text_ids(backbone.tokenizer, config.text, max(config.text_tokens))
    total_runs = len(config.text_tokens) * config.seeds * len(config.memory_tokens) * len(METHODS)
    bar = tqdm(
        total=total_runs * config.steps,
        desc="memorisation",
        unit="step",
        disable=not config.progress,
        dynamic_ncols=True,
    )
    results, before = {}, {}
    with bar:
        for size in config.text_tokens:
            corpora = [_corpus(text, size, config.sequence_length, seed) for seed in range(config.seeds)]
            before[str(size)] = _plain_perplexity(backbone, corpora, config.batch_size)
            curves = {
                f"{method}-{n}": [
                    memorize(backbone, method, n, corpus, config, seed, bar) for seed, corpus in enumerate(corpora)
                ]
                for n in config.memory_tokens
                for method in METHODS
            }
            results[str(size)] = {key: _summarize(runs) for key, runs in curves.items()}
    return {
        "study": "memorization",
        "memorization": results,
        "ppl_before": metrics.mean(before.values()),
        "ppl_before_by_text_tokens": before,
        "seconds": round(time.perf_counter() - start, 1),
        "config": asdict(config),
        "tokmem": tokmem.__version__,
        "machine": machine(),
    }


def _check_memorization(config: MemorizationConfig) -> None:
    bad = [size for size in config.text_tokens if size % config.sequence_length]
    if bad:
        raise TokMemError(f"text sizes {bad} are not multiples of the sequence length {config.sequence_length}")
    if config.steps < 1 or config.eval_every < 1 or config.seeds < 1:
        raise TokMemError("steps, eval_every and seeds must be at least 1")


def _text_ids(tokenizer, path: str, needed: int) -> list[int]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (FileNotFoundError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: cannot read the text to memorise ({err}); pass another with --text") from None
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) < needed:
        raise DataError(f"{path}: {len(ids)} tokens, fewer than the {needed} text tokens asked for")
    return ids


def random_query(rng: random.Random, words: int = 4) -> str:
    """A meaningless query: it only marks where the memory goes relative to it."""
    return " ".join("".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 8))) for _ in range(words))


def _corpus(text: list[int], size: int, length: int, seed: int) -> list[tuple[str, list[int]]]:
    """A random stretch of ``size`` text tokens, cut into sequences of ``length``, each after its own random query."""
    rng = random.Random(f"placement-{seed}-{size}")
    start = rng.randint(0, len(text) - size)
    stretch = text[start : start + size]
    return [(random_query(rng), stretch[i : i + length]) for i in range(0, size, length)]


def _plain_perplexity(backbone: Backbone, corpora, batch_size: int) -> float:
    """The backbone's own perplexity of the sequences (chat-formatted query, then the text), averaged over seeds."""
    model = tokmem.create(backbone)
    return metrics.mean(
        perplexity(model, [lay_out(model, "tokmem", q, t) for q, t in corpus], batch_size) for corpus in corpora
    )


def memorize(backbone, method: str, tokens: int, corpus, config: MemorizationConfig, seed: int = 0, bar=None) -> dict:
    """Train one method's rows on the whole corpus at every step; its perplexity curve.

    ``corpus``: (query, text token ids) pairs; ``bar``: a tqdm bar to advance by one per step.
    """
    bar = bar or tqdm(disable=True)
    model = build(method, tokens, backbone)
    encoded = [lay_out(model, method, query, target) for query, target in corpus]
    micro = math.gcd(len(encoded), config.batch_size)  # micro-batches that tile the text exactly
    train_config = TrainConfig(
        lr=config.lr, epochs=config.steps, batch_size=micro, grad_accum=len(encoded) // micro, seed=seed, progress=False
    )
    steps, ppl = [0], [perplexity(model, encoded, config.batch_size)]
    bar.set_postfix(run=f"{sum(len(t) for _, t in corpus)} tokens {method}-{tokens} seed {seed}")

    def evaluate(step: int, total: int) -> None:
        bar.update()
        if step % config.eval_every == 0 or step == config.steps:
            steps.append(step)
            ppl.append(perplexity(model, encoded, config.batch_size))

    start = time.perf_counter()
    fit(model, encoded, train_config, on_step=evaluate)
    return {"seed": seed, "steps": steps, "ppl": ppl, "seconds": round(time.perf_counter() - start, 1)}


def _summarize(runs: list[dict]) -> dict:
    """Final perplexity and Steps@90%Best averaged over seeds, each seed's values, and the mean curve."""
    per_seed = [
        {"seed": r["seed"], "ppl": r["ppl"][-1], "steps_at_90": steps_at_90(r["steps"], r["ppl"])} for r in runs
    ]
    return {
        "ppl": metrics.mean(r["ppl"] for r in per_seed),
        "steps_at_90": metrics.mean(r["steps_at_90"] for r in per_seed),
        "runs": per_seed,
        "curve": {
            "steps": runs[0]["steps"],
            "ppl": [metrics.mean(values) for values in zip(*(r["ppl"] for r in runs))],
        },
        "seconds": round(sum(r["seconds"] for r in runs), 1),
    }


# ---- GSM8K ----------------------------------------------------------------------------------------------
# How each layout frames a problem: the user turn's text and the target's text.
FRAMES = {"reference": ("question: {}", "answer: {}"), "assistant": ("{}", "{}")}
LAYOUTS = tuple(FRAMES)
Layout = Literal[LAYOUTS]
PROTOCOLS = {
    "reference": "the reference layout (`question: …` user turn, TokMem's memory token before the assistant header, "
    "target `answer: …`)",
    "assistant": "the assistant layout (the bare question, TokMem's memory token after the assistant header, the bare solution as target)",
}


@dataclass
class GSM8KConfig:
    """Defaults are the reference code's protocol (``run_gsm8k_comparsion.sh``): the reference layout, 3
    epochs at lr 5e-3 in batches of 4, the rows of the epoch with the best validation exact match; the whole
    training set (less the validation split; 20% and 100% of it) and the whole test set."""

    backbone: str = backbone_option()
    data: str = option(str(shared_data("gsm8k")), "gsm8k: the folder with train.jsonl and test.jsonl")
    layout: Layout = option(
        "reference",
        "gsm8k: reference = `question: …` user turn, TokMem's memory token, the "
        "assistant header, target `answer: …`; assistant = the memory token after the assistant header",
    )
    train_examples: int | None = option(
        None, "gsm8k: the training subset, the first N problems after the validation split (default: all)"
    )
    validation_examples: int = option(500, "gsm8k: problems held out (the last of train.jsonl) to pick the best epoch")
    test_examples: int | None = option(None, "gsm8k: the first N test problems (default: all)")
    fractions: tuple[float, ...] = (0.2, 1.0)
    epochs: int = option(3, "gsm8k: training epochs (validation after each)")
    lr: float = option(TrainConfig.lr, "learning rate of the rows")
    batch_size: int = option(TrainConfig.batch_size, "training examples per step")
    max_new_tokens: int = option(512, "tokens an answer may generate")
    decode_batch_size: int = option(DecodeConfig.batch_size, "problems answered together")
    seed: int = option(TrainConfig.seed, "seed of the data order and the rows")
    device: str | None = device_option()
    progress: bool = True


def run_gsm8k(config: GSM8KConfig, json_path=None, resume: bool = False) -> dict:
    """Train each method on each fraction of the training subset, keep its best epoch by validation; score the test answers.

    With ``json_path`` the result so far is written after every run; ``resume`` skips the runs it already holds.
    """
    _check_gsm8k(config)
    start = time.perf_counter()
    train_set, validation_set = split_gsm8k(load_gsm8k(Path(config.data) / "train.jsonl"), config)
    test_set = load_gsm8k(Path(config.data) / "test.jsonl")[: config.test_examples]
    result = _gsm8k_start(config, json_path, resume)
    earlier = result["seconds"]
    result.update(train_examples=len(train_set), validation_examples=len(validation_set), test_examples=len(test_set))
    backbone = None
    for fraction in config.fractions:
        subset = train_set[: max(1, round(fraction * len(train_set)))]
        runs = result["gsm8k"].setdefault(f"{100 * fraction:g}", {})
        for method in METHODS:
            if method in runs:
                continue
            backbone = backbone or load_backbone(config.backbone, device=config.device)
            runs[method] = _gsm8k_run(backbone, method, subset, validation_set, test_set, config)
            result["seconds"] = round(earlier + time.perf_counter() - start, 1)
            if json_path is not None:
                write_json_atomic(json_path, result)
    return result


def _gsm8k_start(config: GSM8KConfig, json_path, resume: bool) -> dict:
    """The result so far: the saved JSON when resuming (its settings must match but for the device), else an empty one."""
    settings = json.loads(json.dumps(asdict(config)))  # as the JSON holds them: tuples become lists
    saved = resumed(json_path if resume else None, "gsm8k", settings, ("device", "progress"))
    if saved is not None:
        return saved
    return {
        "study": "gsm8k",
        "gsm8k": {},
        "seconds": 0.0,
        "config": settings,
        "tokmem": tokmem.__version__,
        "machine": machine(),
    }


def _check_gsm8k(config: GSM8KConfig) -> None:
    if config.layout not in LAYOUTS:
        raise TokMemError(f"unknown GSM8K layout '{config.layout}' (choose from {', '.join(LAYOUTS)})")
    if config.epochs < 1 or config.validation_examples < 1:
        raise TokMemError("epochs and validation_examples must be at least 1")


def split_gsm8k(problems: list[Problem], config: GSM8KConfig) -> tuple[list[Problem], list[Problem]]:
    """(training subset, validation split): the last ``validation_examples`` problems are held out for
    validation, the training subset is the first ``train_examples`` of the rest."""
    held_out = config.validation_examples
    if len(problems) <= held_out:
        raise DataError(
            f"{config.data}/train.jsonl: {len(problems)} problems, too few to hold out {held_out} for validation"
        )
    return problems[:-held_out][: config.train_examples], problems[-held_out:]


def gsm8k_context(model: TokMemModel, method: str, layout: str, question: str) -> list[int]:
    """What comes before the answer, in training and at test time: the question framed and the rows placed as ``layout`` says."""
    return context(model, method, FRAMES[layout][0].format(question), layout)


def gsm8k_encode(model: TokMemModel, method: str, layout: str, problem: Problem) -> Encoded:
    """One training sequence: the context, then the framed answer and EOS, the only labelled tokens."""
    answer = FRAMES[layout][1].format(problem.answer)
    return _targeted(
        gsm8k_context(model, method, layout, problem.question), prefix.response_ids(model.backbone.tokenizer, answer)
    )


def gsm8k_scores(answers: list[str], problems: list[Problem]) -> dict:
    """Compliance (the reference rule: ``#### `` anywhere), strict compliance (ends with ``#### <number>``) and exact match."""
    return {
        "compliance": metrics.mean(map(gsm8k_compliant, answers)),
        "strict_compliance": metrics.mean(map(gsm8k_strictly_compliant, answers)),
        "em": metrics.mean(metrics.gsm8k_exact_match(a, p.answer) for a, p in zip(answers, problems)),
    }


class BestByValidation:
    """The validation curve of a training run and a copy of the bank at its best epoch.

    Best: the highest exact match, then the highest compliance; the earliest of equals.  ``offer`` is
    called from ``fit``'s ``on_step`` (the rows are live there); ``restore`` after ``fit``.
    """

    def __init__(self):
        self.curve: list[dict] = []
        self.epoch: int | None = None
        self._key: tuple[float, float] | None = None
        self._bank = None

    def offer(self, model: TokMemModel, epoch: int, scores: dict) -> None:
        self.curve.append({"epoch": epoch, **scores})
        key = (scores["em"], scores["compliance"])
        if self._key is None or key > self._key:
            model.write_rows()
            self.epoch, self._key, self._bank = epoch, key, copy.deepcopy(model.bank)

    def restore(self, model: TokMemModel) -> None:
        """Put the best epoch's rows back into the model."""
        model.bank = self._bank


def epoch_ends(examples: int, batch_size: int, epochs: int) -> dict[int, int]:
    """The optimiser step that completes each epoch → that epoch.

    ``fit`` runs the epochs back to back, so when the examples do not fill whole batches a batch spans
    two epochs: an epoch ends at the step that holds its last example (of two ending at one step, the later counts).
    """
    return {math.ceil(epoch * examples / batch_size): epoch for epoch in range(1, epochs + 1)}


def _gsm8k_run(backbone, method: str, train_set, validation_set, test_set, config: GSM8KConfig) -> dict:
    model = build(method, 1, backbone, name="gsm8k")
    encoded = [gsm8k_encode(model, method, config.layout, p) for p in train_set]
    tqdm.write(f"GSM8K {LABELS[method]}: training on {len(train_set)} problems, {config.epochs} epochs")
    train_config = TrainConfig(
        lr=config.lr, epochs=config.epochs, batch_size=config.batch_size, seed=config.seed, progress=config.progress
    )
    best, ends = BestByValidation(), epoch_ends(len(encoded), config.batch_size, config.epochs)

    def validate(step: int, total: int) -> None:
        if step in ends:
            answers = _answer(model, method, validation_set, config, f"validating epoch {ends[step]}")
            best.offer(model, ends[step], gsm8k_scores(answers, validation_set))

    report = fit(model, encoded, train_config, on_step=validate)
    best.restore(model)
    answers = _answer(model, method, test_set, config, "testing")
    return {
        **gsm8k_scores(answers, test_set),
        "best_epoch": best.epoch,
        "validation": best.curve,
        "train_examples": len(train_set),
        "steps": report.steps,
        "train_seconds": round(report.seconds, 1),
        "samples": [{"question": p.question, "answer": a} for p, a in zip(test_set[:3], answers)],
    }


def _answer(model, method: str, problems: list[Problem], config: GSM8KConfig, what: str) -> list[str]:
    """Greedy answers after each problem's context, laid out as in training."""
    contexts = [gsm8k_context(model, method, config.layout, p.question) for p in problems]
    decode = DecodeConfig(max_new_tokens=config.max_new_tokens, batch_size=config.decode_batch_size, seed=config.seed)
    size = config.decode_batch_size
    answers = []
    for start in tqdm(
        range(0, len(contexts), size),
        desc=what,
        unit="batch",
        disable=not config.progress,
        dynamic_ncols=True,
        leave=False,
    ):
        answers += complete(model, contexts[start : start + size], decode)
    return answers


# ---- tables and plots ----------------------------------------------------------------------------------
def memorization_markdown(result: dict) -> str:
    """The paper's memorisation table layout: per text size, Steps@90%Best and PPL, one row per method."""
    config, sizes = result["config"], list(result["memorization"])
    header = ["Method"] + [f"{s} tokens: {column}" for s in sizes for column in ("Steps@90%Best ↓", "PPL ↓")]
    rows = [
        [f"{LABELS[method]}-{n}"]
        + [cell for s in sizes for cell in _memorization_cells(result["memorization"][s][f"{method}-{n}"])]
        for n in config["memory_tokens"]
        for method in METHODS
    ]
    rows.append(
        ["Backbone, no memory"]
        + [cell for s in sizes for cell in ("–", f"{result['ppl_before_by_text_tokens'][s]:.2f}")]
    )
    note = (
        f"Memorisation on {config['backbone']}: final perplexity and Steps@90%Best (evaluated every "
        f"{config['eval_every']} of {config['steps']} steps), mean of {config['seeds']} seeds.\n\n"
    )
    return note + markdown_table(header, rows)


def _memorization_cells(entry: dict) -> tuple[str, str]:
    return f"{entry['steps_at_90']:.0f}", f"{entry['ppl']:.2f}"


def gsm8k_markdown(result: dict) -> str:
    """The paper's GSM8K table layout: per data fraction, both compliances and EM (%) of each method, and the kept epoch."""
    config = result["config"]
    rows = [
        [f"{fraction}%", LABELS[method], *_gsm8k_cells(methods[method], config["epochs"])]
        for fraction, methods in result["gsm8k"].items()
        for method in METHODS
    ]
    note = (
        f"GSM8K on {config['backbone']}, {PROTOCOLS[config['layout']]}: {config['epochs']} epochs at lr {config['lr']:g}, "
        f"the rows of the epoch with the best exact match (ties: compliance) on {result['validation_examples']} held-out "
        f"training problems; {result['train_examples']} training problems (100%), {result['test_examples']} test problems. "
        "Compliance: `#### ` anywhere in the answer (the reference rule); strict: the answer ends with `#### <number>`.\n\n"
    )
    header = ["Data%", "Method", "Compliance ↑", "Strict compliance ↑", "EM ↑", "Kept epoch"]
    return note + markdown_table(header, rows)


def _gsm8k_cells(scores: dict, epochs: int) -> list[str]:
    """Compliance, strict compliance and exact match (%), and the epoch kept."""
    percentages = [f"{100 * scores[key]:.1f}" for key in ("compliance", "strict_compliance", "em")]
    return percentages + [f"{scores['best_epoch']} of {epochs}"]


def plot_memorization(result: dict, path) -> Path:
    """Mean perplexity vs training steps, one panel per text size, one line per method and token budget."""
    panels = []
    for size, methods in result["memorization"].items():
        panel = Panel(f"{size} text tokens", "training step", "perplexity")
        for n in result["config"]["memory_tokens"]:
            for method in METHODS:
                curve = methods[f"{method}-{n}"]["curve"]
                panel.series[f"{LABELS[method]}-{n}"] = (curve["steps"], curve["ppl"], None)
        panels.append(panel)
    return line_plot(path, panels)


# ---- presets and outputs -----------------------------------------------------------------------------------
# cpu: smollm2-135m on a CPU, memorisation in 24 runs of 60 steps, GSM8K on 240 training problems (run times:
# docs/studies.md).
PRESETS = {
    "memorization": {
        "paper": MemorizationConfig(),
        "cpu": MemorizationConfig(text_tokens=(128, 256), steps=60, eval_every=10, seeds=2, lr=2e-2),
    },
    "gsm8k": {
        "paper": GSM8KConfig(),
        "cpu": GSM8KConfig(train_examples=240, validation_examples=32, test_examples=64, max_new_tokens=256),
    },
}


def run_study(study: str, config, json_path, resume: bool = False) -> dict:
    """Run a study and write its JSON, its markdown table (.md beside it) and, for memorisation, its plot (.png).

    GSM8K writes its JSON after every run as well, so that ``resume`` can skip the finished ones.
    """
    json_path = Path(json_path)
    if study == "memorization":
        result = run_memorization(config)
        plot_memorization(result, json_path.with_suffix(".png"))
    else:
        result = run_gsm8k(config, json_path, resume)
    write_json_atomic(json_path, result)
    write_text_atomic(json_path.with_suffix(".md"), markdown(study, result))
    return result


def markdown(study: str, result: dict) -> str:
    return memorization_markdown(result) if study == "memorization" else gsm8k_markdown(result)


def outputs(study: str, json_path) -> list[Path]:
    """The files ``run_study`` writes."""
    json_path = Path(json_path)
    plots = [json_path.with_suffix(".png")] if study == "memorization" else []
    return [*plots, json_path, json_path.with_suffix(".md")]
