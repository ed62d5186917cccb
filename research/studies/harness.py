"""What every study repeats: a progress bar per phase of a run, learning a round, answering all queries, resuming.

A study is a config dataclass and a function returning a result dict; these are the steps they share.
"""

from __future__ import annotations

import functools
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from tokmem.errors import TokMemError
from tokmem.io import read_json, write_json_atomic
from research.methods.method import Answer, Method
from tokmem.report import machine

RESUME_IGNORES = ("device", "preset")  # settings a run may differ in and still be resumed or reused


class PhaseBars:
    """A run's progress, one bar per phase (a method learning a round, a method answering): each bar's rate and time
    left are its phase's own.  (One bar over a whole run mixed training steps and answers of methods whose speeds
    differ many times over, and its estimate was hours off.)"""

    def __init__(self, progress: bool = True):
        self.progress, self.bar = progress, None

    def phase(self, description: str, total: int) -> None:
        """Close the current phase's bar and start the next one's: ``total`` units (examples or queries)."""
        self.close()
        self.bar = tqdm(total=total, desc=description, unit="ex", disable=not self.progress, dynamic_ncols=True)

    def update(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def write(self, text: str) -> None:
        tqdm.write(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


@dataclass
class MethodResult:
    """What every study records of a method beside its scores (its JSON keys: ``asdict``)."""

    label: str  # as tables print it
    updates: int  # optimiser steps taken so far: the budget methods are compared at
    trainable_params: int
    eval_seconds: float  # answering the test queries
    learn_report: dict | None = None  # ``Method.learn_report``: e.g. TokMem's routing refit, training calls routed

    @classmethod
    def of(cls, method: Method, started: float) -> MethodResult:
        """``method`` as it stands, having answered since ``started`` (a ``time.perf_counter()``)."""
        seconds = round(time.perf_counter() - started, 2)
        return cls(method.label, method.updates, method.trainable_params(), seconds, method.learn_report)


def progress_bar(progress: bool) -> PhaseBars:
    """A run's progress bars (``PhaseBars``); ``progress=False`` shows none."""
    return PhaseBars(progress)


def learn_round(method: Method, examples, what: str, bar) -> float:
    """One round of learning, the bar advancing after each of its steps; returns the seconds it took."""
    start = time.perf_counter()
    units, shown = method.epochs * len(examples), 0
    bar.phase(f"{method.name}: learning {what}", units)

    def advance(fraction: float) -> None:
        nonlocal shown
        bar.update(round(units * fraction) - shown)
        shown = round(units * fraction)

    method.on_step = advance
    try:
        method.learn(examples)
    finally:
        method.on_step = None
    bar.update(units - shown)
    return time.perf_counter() - start


def answer_all(method: Method, queries: list[str], batch_size: int, bar) -> list[Answer]:
    """Answers in query order, asked in batches of similar length (less padding)."""
    order = sorted(range(len(queries)), key=lambda i: len(queries[i]))
    answers: list[Answer | None] = [None] * len(queries)
    for first in range(0, len(order), batch_size):
        chunk = order[first : first + batch_size]
        for i, answer in zip(chunk, method.answer([queries[i] for i in chunk])):
            answers[i] = answer
        bar.update(len(chunk))
    return answers


def resumed(
    json_path,
    study: str,
    settings: dict,
    ignores=(),
    remedy: str = "drop --resume to start over",
    defaults: dict | None = None,
) -> dict | None:
    """The result saved in ``json_path`` to continue from, or None when there is none (or no path: not resuming).

    It must be of the same ``study`` and have the same ``settings`` but for ``ignores`` (the device, …); a setting
    the saved run does not have (an option added since) counts as its value in ``defaults``, what the code did
    before the option existed.  The error otherwise says what to do (``remedy``)."""
    if json_path is None or not Path(json_path).is_file():
        return None
    saved = read_json(json_path)
    before = {**(defaults or {}), **saved.get("config", {})}
    changed = [key for key in settings if key not in ignores and before.get(key) != settings[key]]
    if saved.get("study") != study or changed:
        raise TokMemError(
            f"cannot resume {json_path}: it was run with other settings ({', '.join(changed) or 'another study'}); "
            f"use the same options, or {remedy}"
        )
    return saved


def resumed_run(config, json_path, study: str, remedy: str = "drop --resume to start over") -> dict | None:
    """``resumed`` for a study's config dataclass: the result saved in ``json_path`` (None when there is none) if it
    was run with the same settings but for ``RESUME_IGNORES``; an option the saved run predates counts as its
    default."""
    defaults = {f.name: f.default for f in fields(config) if f.default is not MISSING}
    return resumed(json_path, study, config_settings(config), RESUME_IGNORES, remedy, json.loads(json.dumps(defaults)))


def config_settings(config) -> dict:
    """The config as its JSON reads back (tuples as lists)."""
    return json.loads(json.dumps(asdict(config)))


# ---- several seeds and budgets -----------------------------------------------------------------------------
PLAIN = (
    "trainable_params",
    "updates",
    "round",
    "num_tasks",
    "train_per_task",
)  # the same in every seed: kept as numbers
# counts by name (``eval.steps.outcomes``' wrong key sets, by key): a name one seed's tally lacks counts 0 there
TALLIES = ("left out", "added")


def aggregate_seeds(results: list[dict], keys: tuple[str, ...]) -> dict:
    """The per-seed results of one study and budget as one result of the same shape: the first's, with every
    number under ``keys`` (the scores) replaced by ``{"avg", "sd", "per_seed"}`` over the seeds (sd 0 for one
    seed); texts (labels, sample answers) are the first seed's.  Top-level ``seeds`` lists the seeds."""
    combined = dict(results[0]) | {key: _combine([r[key] for r in results]) for key in keys if key in results[0]}
    return combined | {"seeds": [r["config"]["seed"] for r in results]}


def seed_spread(values: list[float]) -> dict:
    """A score over seeds: ``{"avg", "sd" (sample standard deviation; 0 for one seed), "per_seed"}``."""
    return {
        "avg": statistics.fmean(values),
        "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
        "per_seed": values,
    }


def _combine(values: list, key: str | None = None):
    first = values[0]
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        if key in PLAIN and all(v == first for v in values):
            return first
        return seed_spread(values)
    if isinstance(first, dict) and key in TALLIES:
        names = dict.fromkeys(name for tally in values for name in tally)
        return {name: seed_spread([tally.get(name, 0) for tally in values]) for name in names}
    if isinstance(first, dict):
        return {
            k: _combine([v[k] for v in values], k) for k in first if all(isinstance(v, dict) and k in v for v in values)
        }
    if isinstance(first, list) and all(isinstance(v, list) and len(v) == len(first) for v in values):
        return [_combine(list(items), key) for items in zip(*values)]
    return first


def run_repeats(
    config,
    run_one: Callable[[Any, Path], dict],
    json_path,
    keys: tuple[str, ...],
    write: Callable[[dict], Any] | None = None,
) -> dict:
    """One run of the study per budget (``config.epoch_budgets``: epochs of every trained method; past the first
    budget only the trained methods) and seed (``config.seeds``), one after the other, each saved to
    ``<json stem>-runs/epochs<b>-seed<s>.json``; a run already finished there (with the same settings) is read, not
    run again.  ``run_one(config, path)`` runs one, continuing what a stopped run saved at ``path``, and saves it
    there.  Returns ``{"study": "repeats",
    "config", "machine", "seeds", "epoch_budgets": {epochs: the seeds' results aggregated (`aggregate_seeds`)},
    "runs": [paths]}``, saved after every run by ``write`` (the study's JSON and tables; default: the JSON to
    ``json_path``), so a stopped command leaves the tables of the runs it finished."""
    json_path = Path(json_path)
    write = write or functools.partial(write_json_atomic, json_path)
    budgets, seeds = config.epoch_budgets or (config.epochs,), config.seeds or (config.seed,)
    folder = json_path.with_name(f"{json_path.stem}-runs")
    combined = {
        "study": "repeats",
        "config": config_settings(config),
        "machine": machine(),
        "seeds": list(seeds),
        "epoch_budgets": {},
        "runs": [],
    }
    for epochs in budgets:
        results = []
        for seed in seeds:
            one = _budget_run(config, epochs, seed, first=epochs == budgets[0])
            if one is None:
                break
            path = folder / f"epochs{epochs}-seed{seed}.json"
            saved = _saved_run(one, path)
            results.append(saved if saved.get("finished") else _finish(run_one(one, path), path))
            combined["runs"].append(str(path))
            combined["epoch_budgets"][str(epochs)] = aggregate_seeds(results, keys)
            write(combined)
    return combined


def _budget_run(config, epochs: int, seed: int, first: bool):
    """The config of one run.  Past the first budget only the methods that train run: the others (ICL, RAG, the
    base model) answer the same at every budget, so their rows are those of the first budget's tables; None when
    no method trains."""
    one = replace(config, epochs=epochs, seed=seed, seeds=None, epoch_budgets=None).resolved()
    trained = tuple(m for m in one.methods if one.epochs_of(m))
    if first or trained == one.methods:
        return one
    return replace(one, methods=trained) if trained else None


def _saved_run(config, path: Path) -> dict:
    """The run saved at ``path`` ({} when there is none): finished, to be reused, or stopped, to be resumed by
    ``run_one``; an error when it was run with other settings."""
    if not path.is_file():
        return {}
    return resumed_run(config, path, read_json(path).get("study"), "remove that run file, or choose another --json")


def _finish(result: dict, path: Path) -> dict:
    result["finished"] = True
    write_json_atomic(path, result)
    return result
