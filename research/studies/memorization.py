"""Memorisation: compress a text into n rows, placed as TokMem's infix memory or as a prefix (`research.studies.placement`).

The text is one the backbone cannot have seen (by default the paper's own LaTeX source, written after the default
backbone was trained).  Each seed takes a random stretch of ``text_tokens`` tokens, cut into sequences of
``sequence_length`` (128), each after its own random query that only marks the placement.  Every optimiser step covers
the whole text; the text's perplexity is evaluated every ``eval_every`` steps.  Reported: the final perplexity and
Steps@90%Best (`steps_at_90`), averaged over seeds, with the mean curves; ``run_study`` writes them with the study's
table and plot (`research.studies.memorization_report`).  The settings and presets:
`research.studies.memorization_config`.
"""

from __future__ import annotations

import math
import random
import string
import time
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm.auto import tqdm

import tokmem
from tokmem.backbones import Backbone, load_backbone
from tokmem.errors import DataError, TokMemError
from tokmem.eval import metrics
from tokmem.model import TokMemModel
from tokmem.report import machine
from tokmem.training.sequences import Encoded, collate
from research.studies.memorization_config import MemorizationConfig
from research.studies.memorization_report import write_outputs
from research.studies.placement import METHODS, build, lay_out
from tokmem.training.train import TrainConfig, fit
from tokmem.training.loss import batch_loss


def run_memorization(config: MemorizationConfig) -> dict:
    """Memorise ``text_tokens`` tokens of the text into each method's rows; perplexity curves per seed.

    ``ppl_before`` is the backbone's own perplexity of the same sequences (no memory, no training),
    averaged over seeds and text sizes.
    """
    _check_memorization(config)
    start = time.perf_counter()
    backbone = load_backbone(config.backbone, device=config.device)
    text = _text_ids(backbone.tokenizer, config.text, max(config.text_tokens))
    total_runs = len(config.text_tokens) * len(config.seeds) * len(config.memory_tokens) * len(METHODS)
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
            corpora = [_corpus(text, size, config.sequence_length, seed) for seed in config.seeds]
            before[str(size)] = _plain_perplexity(backbone, corpora, config.batch_size)
            curves = {
                f"{method}-{n}": [
                    memorize(backbone, method, n, corpus, config, seed, bar)
                    for seed, corpus in zip(config.seeds, corpora)
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
    if config.steps < 1 or config.eval_every < 1 or not config.seeds:
        raise TokMemError("steps and eval_every must be at least 1, with one seed or more")


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


@torch.no_grad()
def perplexity(model: TokMemModel, encoded: list[Encoded], batch_size: int) -> float:
    """Perplexity of the labelled tokens of ``encoded`` under the model (its live rows while training)."""
    pad = model.backbone.tokenizer.pad_token_id
    nll, count = 0.0, 0
    for start in range(0, len(encoded), batch_size):
        batch = collate(encoded[start : start + batch_size], pad)
        loss, n = batch_loss(model, {k: v.to(model.device) for k, v in batch.items()})
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


def run_study(config: MemorizationConfig, json_path) -> dict:
    """Run the study and write its JSON, its markdown table (.md beside it) and its plot (.png)."""
    result = run_memorization(config)
    write_outputs(result, json_path)
    return result
