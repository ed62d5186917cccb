"""Compositional tool calling: the paper's Table 3, compositional generalisation and forgetting.

Each tool is one procedure; a query needs 2–4 calls, answered as calls one JSON object a line
(TokMem: one call per memory-token segment).  Three studies, each a function returning a result dict:

* main (`run_main`, Table 3): ICL, RAG, fine-tuning (LoRA r=8 on q, v) and TokMem without and with
  the adaptation phase learn the training queries of the evaluation tools; all answer the test queries.  On request
  (``methods``) also the backbone's own tool calling, every schema or the retrieved ones in its chat template
  (`research.methods.native`; a backbone whose template has tool support).
* generalization (`run_generalization`): fine-tuning and TokMem learn training sets whose queries
  have at most 1, 2, 3 or 4 calls; the test set (2–4 calls) is the same for all.  TokMem's adaptation
  phase (on other tools, up to 4 calls) is the same for every cap, as in the paper, whose 4-call row
  repeats Table 3.
* recipe (`run_recipe`): the training-recipe ablation.  TokMem (with adaptation) learns the main study's data
  once as configured and once for each recipe option switched to its alternative alone (row initialisation,
  learning-rate schedule, tool segments), at the same budget; the adaptation phase is shared.
* forgetting (`run_forgetting`): the evaluation tools arrive in ``rounds`` equal groups, each with its
  own training and test queries (composed within the group); after each round every method answers
  the test queries of every group seen so far.  TokMem (renormalised as configured, a continual ``learn`` a
  round) against fine-tuning with replay, TokMem renormalised only after each round (the reference code
  renormalises after every step too), TokMem without renormalisation (whose new rows' L2 norms show the
  norm inflation), and TokMem with an unfrozen backbone (`research.methods.tokmem.UnfrozenTokMem`).

Scores, per number of gold calls and their mean over those numbers ("avg", as the paper averages):
tool-selection F1 (multiset F1 of the called tools' names) and argument F1 (multiset F1 of whole
calls after AST normalisation), 0–100, averaged over queries (`tokmem.eval.metrics`).  One rule for every
method: a call's tool is the name its text gives; a predicted call that does not parse matches no gold call (it
lowers argument F1) and names no tool.  TokMem's memory-token choices are scored apart, as routing F1.  Beside the
scores, what answering cost per gold call: the prompt tokens the backbone read (``prompt_tokens_per_call``) and the
seconds it took (``seconds_per_call``; in the tool loop, of the per-step evaluation: one answer per gold call).

TokMem with adaptation (the default TokMem, as in the paper) learns its memory tokens on a backbone
adapted once per study (`tokmem.adapt`) on the held-out adaptation tools; its trainable parameters
are its memory rows (the adaptation's LoRA, merged on other tools, is not counted, as in the paper).
The data is the built-in catalog (`tokmem.data.tool_catalog`), an xLAM file (as in the reference code:
ranks 1..adapt_tools adapt, the next ``tools`` ranks evaluate) or, with ``dataset="complexfuncbench"``, real
data nobody here wrote (`research.studies.realtools`): ComplexFuncBench's records over 38 Booking.com tools
(split by query hash into train, dev and test: ``split`` names the one answered; ``train_multi`` records train) to
evaluate, BFCL's multi-turn tools (``adapt_multi`` turns) and/or ComplexFuncBench's own flight tools, held out of the
evaluation (``adapt_data``), to adapt; main and recipe studies.
"""

from __future__ import annotations

import copy
import time
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path

from tokmem.backbones import Backbone
from tokmem.data.procedures import Example
from research.studies.compositional_config import ABLATION, LOOP_ABLATION, CompositionalConfig
from research.studies.realtools import ADAPT_SOURCE_NAMES
from tokmem.data.tool_datasets import ToolData
from tokmem.errors import TokMemError
from tokmem.eval import metrics
from tokmem.eval.evaluate import score_calls
from tokmem.eval.steps import total_key
from tokmem.io import write_json_atomic
from research.methods.method import Method, memory_routes, predicted_calls
from tokmem.report import machine
from research.studies.harness import (
    MethodResult,
    answer_all,
    learn_round,
    progress_bar,
    resumed_run,
    run_repeats,
)
from tokmem.training.sequences import RESULT_TOKENS
from research.studies.tool_loop import loop_scores
from research.methods.lora import LoRA
from research.methods.tokmem import TokMem
from research.studies.tool_setup import (
    TOKMEM_LABELS,
    build_method,
    groups,
    new_row_norms,
    prepare_backbones,
    real_data,
    tool_data,
)

METRICS = metrics.CALL_METRICS


# ---- scoring ------------------------------------------------------------------------------------------
def evaluate(method: Method, examples: list[Example], batch_size: int, bar, samples: int = 3) -> dict:
    """Scores of the method's answers to ``examples``, its trainable parameters and a few answers to read."""
    start = time.perf_counter()
    bar.phase(f"{method.name}: answering {len(examples)} queries", len(examples))
    answers, cost = answered(method, [e.query for e in examples], batch_size, bar, sum(len(e.steps) for e in examples))
    predictions = [predicted_calls(a) for a in answers]
    return {
        **asdict(MethodResult.of(method, start)),
        **score_calls(examples, predictions, routes(answers)),
        **cost,
        "samples": answer_samples(examples[:samples], predictions),
    }


def answered(method: Method, queries: list[str], batch_size: int, bar, calls: int) -> tuple[list, dict]:
    """The method's answers to ``queries`` (``answer_all``) and what they cost per gold call of the ``calls`` they
    are due (``metrics.answering_cost``: one prompt answers all the calls of a query)."""
    start = time.perf_counter()
    answers = answer_all(method, queries, batch_size, bar)
    seconds = time.perf_counter() - start
    return answers, metrics.answering_cost(sum(map(len, method.prompt_ids(queries))), seconds, calls)


def answer_samples(examples: list[Example], predictions: list) -> list[dict]:
    """Queries with their gold and predicted calls, for a reader to see what the scores mean."""
    return [
        {"query": e.query, "gold": [s.response for s in e.steps], "predicted": p} for e, p in zip(examples, predictions)
    ]


def routes(answers: list) -> list[list[str]] | None:
    """Each answer's memory-token tools when the method has memory tokens (TokMem), else None."""
    chosen = [memory_routes(a) for a in answers]
    return None if any(r is None for r in chosen) else chosen


def learn_and_evaluate(method: Method, data: ToolData, config: CompositionalConfig, bar) -> dict:
    seconds = learn_round(method, data.train, f"{len(data.train)} queries", bar)
    return scores_of(method, data, config, bar) | {"train_seconds": round(seconds, 2)}


def scores_of(method: Method, data: ToolData, config: CompositionalConfig, bar) -> dict:
    """A trained method's scores on the test records: its answers (``evaluate``), or in the tool loop per step and
    end to end (``tool_loop.loop_scores``)."""
    if not config.tool_loop():
        return evaluate(method, data.test, config.eval_batch_size, bar)
    start = time.perf_counter()
    scores = loop_scores(method, data.test, config.max_calls, RESULT_TOKENS, bar, config.end_to_end)
    norms = new_row_norms(method, method.model.bank.names) if isinstance(method, TokMem) else None
    return {**asdict(MethodResult.of(method, start)), **scores, **({"row_norms": norms} if norms else {})}


# ---- the studies -----------------------------------------------------------------------------------------
SCORE_KEYS = ("methods", "train_max_calls", "variants")  # where a result's scores are (averaged over seeds)


def run_all(
    config: CompositionalConfig,
    backbone: Backbone | None = None,
    progress: bool = True,
    json_path=None,
    write=None,
    resume: bool = False,
) -> dict:
    """The study once, or, with several seeds or budgets, once per seed and budget (``harness.run_repeats``: each
    run continues where it stopped).  ``write`` saves the result and its tables: after the one run, or the combined
    result after every run.  ``resume``: the one run keeps the methods ``json_path`` holds (`run`)."""
    if not config.repeated():
        result = run(config, backbone, progress, json_path, resume)
        if write is not None:
            write(result)
        return result
    if json_path is None:
        raise TokMemError("several seeds or budgets need a result file (--json): each run is saved beside it")
    return run_repeats(
        config, lambda one, path: run(one, backbone, progress, path, resume=True), json_path, SCORE_KEYS, write
    )


def run(
    config: CompositionalConfig,
    backbone: Backbone | None = None,
    progress: bool = True,
    json_path=None,
    resume: bool = False,
) -> dict:
    """The study ``config.study`` names; ``json_path``: where to save the result so far after every method.
    ``resume``: keep the methods the result in ``json_path`` finished (it must have the same settings but for the
    device) and run the others; a forgetting method is kept once it has finished every round."""
    runners = {
        "main": run_main,
        "generalization": run_generalization,
        "forgetting": run_forgetting,
        "recipe": run_recipe,
    }
    config = config.resolved()
    saved = resumed_run(config, json_path if resume else None, config.study)
    return runners[config.study](config, backbone, progress, json_path, saved)


def kept_methods(saved: dict | None, *where: str) -> dict:
    """The methods a resumed run's saved result (read before the run overwrites it) holds under ``where``, a study's
    point (e.g. "variants", a label); {} when not resuming."""
    saved = saved or {}
    for key in (*where, "methods"):
        saved = saved.get(key, {})
    return dict(saved)


def fill_methods(into: dict, names, kept: dict, score_one, bar, save, prefix: str = "") -> None:
    """``into[name]`` for every method in order: the scores a resumed run kept, else ``score_one(name)``; a progress
    line and a save after each."""
    for name in names:
        into[name] = kept[name] if name in kept else score_one(name)
        bar.write(prefix + summary_line(name, into[name]) + (" (kept from the saved run)" if name in kept else ""))
        save()


def run_main(config: CompositionalConfig, backbone=None, progress: bool = True, json_path=None, saved=None) -> dict:
    data = tool_data(config, (1, config.tools))
    backbones, adaptation = prepare_backbones(config, backbone, progress)
    result = _start(config, [data], adaptation) | {"methods": {}}
    bar, trained = progress_bar(progress), {}
    kept = kept_methods(saved)
    if LOOP_ABLATION in config.methods and LOOP_ABLATION not in kept:  # it answers with TokMem's trained bank
        kept.pop("tokmem", None)

    def score_one(name: str) -> dict:
        if name == LOOP_ABLATION and "tokmem" in trained:  # a decoding switch: TokMem (w/ adapt)'s bank, answered anew
            scores = scores_of(free_arguments(trained["tokmem"]), data, config, bar)
            return scores | {"train_seconds": result["methods"]["tokmem"]["train_seconds"]}
        trained[name] = build_method(name, config, backbones, data.tools)
        scores = learn_and_evaluate(trained[name], data, config, bar)
        return scores | keep_bank(trained[name], json_path)

    fill_methods(result["methods"], config.methods, kept, score_one, bar, lambda: _save(result, json_path))
    bar.close()
    return result


def keep_bank(method: Method, json_path) -> dict:
    """A trained method's weights saved beside the run's results (``<json stem>-banks/``), so that it can be answered
    again without training, on other records too (``research/scripts/reanswer_loop.py``): TokMem's bank
    (``<method>.safetensors``, a few hundred kB; ``{"bank": path}``) or LoRA's adapter (``<method>.lora/``: its weights
    and ``adapter.json``, the settings and the backbone it was trained on; ``{"adapter": path}``); {} for another
    method or a run that writes no file."""
    if json_path is None or not isinstance(method, (TokMem, LoRA)):
        return {}
    folder = Path(json_path).with_name(f"{Path(json_path).stem}-banks")
    if isinstance(method, LoRA):
        return {"adapter": str(keep_adapter(method, folder / f"{method.name}.lora"))}
    path = folder / f"{method.name}.safetensors"
    method.model.bank.save(path)
    return {"bank": str(path)}


def keep_adapter(method: LoRA, directory: Path) -> Path:
    """LoRA's trained adapter in ``directory``: its weights (``Adapter.save``) and ``adapter.json``, the settings that
    rebuild it and the backbone it belongs to (name and embedding fingerprint)."""
    method.adapter.save(directory)
    backbone = {"name": method.backbone.name, "fingerprint": method.backbone.fingerprint()}
    write_json_atomic(directory / "adapter.json", {"lora": asdict(method.lora), "backbone": backbone})
    return directory


def free_arguments(method: TokMem) -> TokMem:
    """The trained TokMem decoding its arguments without their schemas (the loop's ablation row)."""
    ablated = copy.copy(method)
    ablated.decode_config = replace(method.decode_config, schema=False)
    ablated.name, ablated.label = LOOP_ABLATION, TOKMEM_LABELS[LOOP_ABLATION]
    return ablated


def run_generalization(
    config: CompositionalConfig, backbone=None, progress: bool = True, json_path=None, saved=None
) -> dict:
    datasets = {n: tool_data(config, (1, config.tools), train_max_calls=n) for n in config.train_max_calls}
    backbones, adaptation = prepare_backbones(config, backbone, progress)
    result = _start(config, list(datasets.values())[:1], adaptation) | {"train_max_calls": {}}
    result["data"]["train"] = {
        str(n): len(d.train) for n, d in datasets.items()
    }  # the test set is the same for every cap
    bar = progress_bar(progress)
    for n, data in datasets.items():
        point = result["train_max_calls"][str(n)] = {"methods": {}}
        fill_methods(
            point["methods"],
            config.methods,
            kept_methods(saved, "train_max_calls", str(n)),
            lambda name: learn_and_evaluate(build_method(name, config, backbones, data.tools), data, config, bar),
            bar,
            lambda: _save(result, json_path),
            prefix=f"trained on ≤ {n} calls: ",
        )
    bar.close()
    return result


def recipe_variants(config: CompositionalConfig) -> dict[str, dict]:
    """ "as configured" and, for each recipe option, the config with that option switched to its alternative."""
    variants = {"as configured": {}}
    for name, values in ABLATION.items():
        other = next(v for v in values if v != getattr(config, name))
        variants[f"{name}: {other} (not {getattr(config, name)})"] = {name: other}
    return variants


def run_recipe(config: CompositionalConfig, backbone=None, progress: bool = True, json_path=None, saved=None) -> dict:
    data = tool_data(config, (1, config.tools))
    backbones, adaptation = prepare_backbones(config, backbone, progress)
    variants = recipe_variants(config)
    result = _start(config, [data], adaptation) | {"variants": {}}
    bar = progress_bar(progress)
    for label, change in variants.items():
        point = result["variants"][label] = {"change": change, "methods": {}}
        variant, variant_backbones = replace(config, **change), backbones
        if variant.tool_segments != config.tool_segments:  # the adaptation phase teaches the layout: adapt for this one
            variant_backbones, point["adaptation"] = prepare_backbones(variant, backbones["base"], progress)
        fill_methods(
            point["methods"],
            config.methods,
            kept_methods(saved, "variants", label),
            lambda name: learn_and_evaluate(
                build_method(name, variant, variant_backbones, data.tools), data, config, bar
            ),
            bar,
            lambda: _save(result, json_path),
            prefix=f"{label}: ",
        )
    bar.close()
    return result


def run_forgetting(
    config: CompositionalConfig, backbone=None, progress: bool = True, json_path=None, saved=None
) -> dict:
    datasets = [tool_data(config, ranks) for ranks in groups(config)]
    backbones, adaptation = prepare_backbones(config, backbone, progress)
    result = _start(config, datasets, adaptation) | {"groups": [list(d.tools) for d in datasets], "methods": {}}
    bar = progress_bar(progress)
    tools = {name: schema for d in datasets for name, schema in d.tools.items()}
    kept = kept_methods(saved)
    for name in config.methods:
        if len(kept.get(name, {}).get("rounds", [])) == len(datasets):
            result["methods"][name] = kept[name]
            bar.write(f"{name}: every round kept from the saved run")
            continue
        method = build_method(name, config, backbones, tools)
        entry = result["methods"][name] = {"label": method.label, "rounds": []}
        for r in range(1, len(datasets) + 1):
            entry["rounds"].append(forgetting_round(method, datasets, r, config, bar))
            entry["trainable_params"] = method.trainable_params()
            _save(result, json_path)
    bar.close()
    return result


def forgetting_round(method: Method, datasets: list[ToolData], r: int, config: CompositionalConfig, bar) -> dict:
    """Round ``r`` (1-based): learn its group's training queries, then answer those of every group so far."""
    data = datasets[r - 1]
    seconds = learn_round(method, data.train, f"round {r}", bar)
    scores, samples, cost = evaluate_groups(method, datasets[:r], config.eval_batch_size, bar)
    bar.write(
        f"{method.name} round {r}: argument F1 "
        + ", ".join(f"group {g} {s['arg_f1']['avg']:.1f}" for g, s in scores.items())
    )
    return {
        "round": r,
        "updates": method.updates,
        "train_seconds": round(seconds, 2),
        "new_rows": new_row_norms(method, list(data.tools)),
        **cost,
        "groups": scores,
        "samples": samples,
    }


def evaluate_groups(
    method: Method, datasets: list[ToolData], batch_size: int, bar
) -> tuple[dict[str, dict], dict[str, list], dict]:
    """Scores on the test queries of each group (1-based), all answered together and then split, each
    group's first answer (following one query over the rounds shows how an old tool's calls change), and what the
    answers cost (``answered``)."""
    tests = [e for d in datasets for e in d.test]
    queries = [e.query for e in tests]
    bar.phase(f"{method.name}: answering {len(queries)} queries", len(queries))
    answers, cost = answered(method, queries, batch_size, bar, sum(len(e.steps) for e in tests))
    predictions, chosen = [predicted_calls(a) for a in answers], routes(answers)
    scores, samples, first = {}, {}, 0
    for g, data in enumerate(datasets, 1):
        part = slice(first, first + len(data.test))
        predicted = predictions[part]
        scores[str(g)] = score_calls(data.test, predicted, chosen[part] if chosen is not None else None)
        samples[str(g)] = answer_samples(data.test[:1], predicted)
        first += len(data.test)
    return scores, samples, cost


def _start(config: CompositionalConfig, datasets: list[ToolData], adaptation: dict | None) -> dict:
    tests = [e for d in datasets for e in d.test]
    return {
        "study": config.study,
        "config": asdict(config),
        "machine": machine(),
        "data": {
            "source": data_source(config),
            "tools": [name for d in datasets for name in d.tools],
            "train": sum(len(d.train) for d in datasets),
            "test": len(tests),
            "test_by_calls": {str(n): c for n, c in sorted(Counter(len(e.steps) for e in tests).items())},
            **(real_data(config).summary() if config.dataset == "complexfuncbench" else {}),
        },
        "adaptation": adaptation,
    }


def data_source(config: CompositionalConfig) -> str:
    if config.dataset == "complexfuncbench":
        test = config.test_data if config.test_data else f"{config.test_fraction:.0%}"
        test = f"split by query hash, {config.dev_fraction:.0%} dev, test {test}; the {config.split} split answered"
        return f"ComplexFuncBench ({test}); {' and '.join(map(ADAPT_SOURCE_NAMES.get, config.adapt_data))} to adapt"
    return config.xlam or "built-in catalog"


def _save(result: dict, json_path) -> None:
    if json_path:
        write_json_atomic(json_path, result)


def summary_line(name: str, scores: dict) -> str:
    """One line of a method's scores (the tool loop's: per step, then end to end)."""
    parts = [(f"{part} ", scores[part]) for part in ("step", "end_to_end") if part in scores] or [("", scores)]
    return f"{name}: " + "; ".join(
        prefix + ", ".join(f"{title.lower()} {part[m][total_key(part[m])]:.1f}" for m, title in METRICS.items())
        for prefix, part in parts
    )
