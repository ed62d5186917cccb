"""Compositional tool calling: the paper's Table 3, compositional generalisation and forgetting.

Each tool is one procedure; a query needs 2–4 calls, answered as calls one JSON object a line
(TokMem: one call per memory-token segment).  Three studies, each a function returning a result dict:

* main (`run_main`, Table 3): ICL, RAG, fine-tuning (LoRA r=8 on q, v) and TokMem without and with
  the adaptation phase learn the training queries of the evaluation tools; all answer the test queries.
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
  norm inflation), and TokMem with an unfrozen backbone (`tokmem.methods.tokmem.UnfrozenTokMem`).

Scores, per number of gold calls and their mean over those numbers ("avg", as the paper averages):
tool-selection F1 (multiset F1 of the called tools' names) and argument F1 (multiset F1 of whole
calls after AST normalisation), 0–100, averaged over queries (`tokmem.eval.metrics`).  A predicted call
that does not parse matches no gold call: it lowers argument F1 and names no tool.

TokMem with adaptation (the default TokMem, as in the paper) learns its memory tokens on a backbone
adapted once per study (`tokmem.adapt`) on the held-out adaptation tools; its trainable parameters
are its memory rows (the adaptation's LoRA, merged on other tools, is not counted, as in the paper).
The data is the built-in catalog (`tokmem.data.tools`), an xLAM file (as in the reference code:
ranks 1..adapt_tools adapt, the next ``tools`` ranks evaluate) or, with ``dataset="complexfuncbench"``, real
data nobody here wrote (`tokmem.data.realtools`): ComplexFuncBench's records over 38 Booking.com tools
(split by query hash; ``train_multi`` / ``test_multi`` records) to evaluate, BFCL's multi-turn tools
(``adapt_multi`` turns) to adapt; main and recipe studies.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from tokmem.eval import metrics
from tokmem.adapt import AdaptConfig, cached_adapt
from tokmem.backbones import DEFAULT_BACKBONE, Backbone, load_backbone
from tokmem.methods.method import Method
from tokmem.methods.lora import LoRA, Replay
from tokmem.methods.tokmem import TokMem, UnfrozenTokMem
from tokmem.methods.tools import ICL, ToolRAG
from tokmem.data.procedures import Example
from tokmem.data.realtools import RealData, complexfuncbench_data, function_calling_dir
from tokmem.data.tools import StudySizes, ToolData, split_tools, tool_dataset, tool_examples
from tokmem.data.xlam import xlam_dataset
from tokmem.config import option
from tokmem.errors import TokMemError
from tokmem.eval.evaluate import predicted_calls, score_calls
from tokmem.studies.harness import answer_all, learn_round, progress_bar
from tokmem.io import write_json_atomic, write_text_atomic
from tokmem.studies.outputs import Panel, line_plot, lines, markdown_table, pivot_table
from tokmem.studies.settings import MethodSettings
from tokmem.report import machine
from tokmem.train import TrainConfig

METRICS = metrics.CALL_METRICS
TOKMEM_LABELS = {
    "tokmem-noadapt": "TokMem (w/o adapt)",
    "tokmem": "TokMem (w/ adapt)",
    "tokmem-roundnorm": "TokMem (renorm after round)",
    "tokmem-norenorm": "TokMem (w/o renorm)",
    "tokmem-unfrozen": "TokMem (unfrozen backbone)",
}
ADAPTED = {"tokmem", "tokmem-roundnorm", "tokmem-norenorm", "tokmem-unfrozen"}  # built on the adapted backbone
MAIN_METHODS = ("icl", "rag", "lora", "tokmem-noadapt", "tokmem")
STUDIES = {  # study → (default methods, methods it accepts)
    "main": (MAIN_METHODS, MAIN_METHODS),
    "generalization": (("lora", "tokmem"), MAIN_METHODS),
    "recipe": (("tokmem",), ("tokmem", "tokmem-noadapt")),
    "forgetting": (
        ("replay", "tokmem", "tokmem-roundnorm", "tokmem-norenorm", "tokmem-unfrozen"),
        ("lora", "replay", "tokmem-noadapt", "tokmem", "tokmem-roundnorm", "tokmem-norenorm", "tokmem-unfrozen"),
    ),
}
# the recipe options the recipe study switches, each alone, with their two values.  Renormalisation is not among
# them: its target is the mean norm of the bank's old rows, and a single round has none (the forgetting study has).
ABLATION = {"init": ("mean", "orthogonal"), "schedule": ("constant", "linear"), "tool_segments": ("arguments", "call")}
XLAM_TOOLS = 50  # the paper's 50 evaluation + 50 adaptation tools, when the data is an xLAM file
DATASETS = ("builtin", "complexfuncbench")
REAL_DATA_STUDIES = ("main", "recipe")


@dataclass(frozen=True)
class CompositionalConfig(MethodSettings):
    """Defaults are the paper's setup.  Sizes are those of ``tool_dataset``; in the forgetting study
    they are per group (each round's tools get ``per_tool``, ``train_multi`` and ``test_multi`` of their own)."""

    study: str = "main"
    methods: tuple[str, ...] | None = option(
        None, "comma-separated methods (main: icl,rag,lora,tokmem-noadapt,tokmem; generalization: lora,tokmem; "
        "forgetting: replay,tokmem,tokmem-roundnorm,tokmem-norenorm,tokmem-unfrozen, also lora,tokmem-noadapt)")
    backbone: str = option(DEFAULT_BACKBONE, "backbone spec")
    xlam: str | None = option(None, "an xLAM / APIGen JSON file (default: the built-in 25 + 25 tool catalog)")
    dataset: str = option("builtin", "builtin or complexfuncbench: ComplexFuncBench's tools to evaluate, BFCL "
                          "multi-turn's to adapt (real data; main and recipe studies)")
    data_dir: str | None = option(None, "complexfuncbench: the folder with complexfuncbench/ and bfcl/ (default: "
                                  "function-calling in the shared data, tokmem.data.shared)")
    test_data: str | None = option(None, "complexfuncbench: a NESTFUL file to test on (your own split) instead of the "
                                   "query-hash split")
    test_fraction: float = option(0.2, "complexfuncbench: share of records the query-hash split tests on")
    tools: int | None = option(None, "evaluation tools (default: all 25 built-in, or 50 from --xlam)")
    adapt_tools: int | None = option(None, "adaptation tools (likewise)")
    per_tool: int = option(StudySizes.per_tool, "single-tool samples per tool")
    train_multi: int = option(StudySizes.train_multi, "composed training queries (forgetting: per round; complexfuncbench: training records)")
    test_multi: int = option(StudySizes.test_multi, "composed test queries (forgetting: per round; complexfuncbench: test records)")
    max_calls: int = option(StudySizes.max_calls, "most calls in a query (complexfuncbench: longer records are left out and counted)")
    adapt_per_tool: int = option(StudySizes.per_tool, "single-tool samples per adaptation tool")
    adapt_multi: int = option(3750, "composed adaptation queries (with 50 single-tool samples of each of 25 tools: "
                              "the reference's 5,000 samples; complexfuncbench: BFCL multi-turn turns)")
    train_max_calls: tuple[int, ...] = option((1, 2, 3, 4), "generalization: caps on the calls of a training query")
    rounds: int = option(5, "forgetting: rounds (groups of tools)")
    adapt_epochs: int = option(1, "epochs of the adaptation phase")
    max_new_tokens: int = option(512, "tokens an answer may generate (four calls with long arguments)")
    adapt_lr: float = option(AdaptConfig.lr, "learning rate of the adaptation phase's LoRA (rank --lora-rank, "
                             "alpha 32, as the reference's)")
    adapt_dropout: float = option(AdaptConfig.dropout, "dropout of the adaptation phase's LoRA (0 is several times "
                                  "faster on CPU)")
    adapt_cache: str | None = option(None, "directory of cached adapted backbones (default <tokmem cache>/adapted)")
    rag_k: int = option(4, "tools RAG retrieves")
    shots: int = option(2, "demonstrations ICL and RAG show")
    replay_ratio: float = option(0.2, "share of replayed examples in a batch")
    replay_buffer: int = option(1000, "examples the replay buffer keeps")

    def resolved(self) -> "CompositionalConfig":
        """Fill the defaults that depend on the study and the data; check the rest."""
        if self.study not in STUDIES:
            raise TokMemError(f"unknown study '{self.study}': choose from {', '.join(STUDIES)}")
        if self.dataset not in DATASETS:
            raise TokMemError(f"unknown dataset '{self.dataset}': choose from {', '.join(DATASETS)} (or pass --xlam FILE)")
        defaults, accepted = STUDIES[self.study]
        unknown = [m for m in self.methods or defaults if m not in accepted]
        if unknown:
            raise TokMemError(f"the {self.study} study cannot run {', '.join(unknown)}: choose from {', '.join(accepted)}")
        config = replace(self, methods=tuple(self.methods or defaults))
        return config._checked_real() if self.dataset != "builtin" else config._with_tool_counts()

    def _checked_real(self) -> "CompositionalConfig":
        if self.xlam:
            raise TokMemError(f"--xlam and --dataset {self.dataset} are two data sources: pass one")
        if self.study not in REAL_DATA_STUDIES:
            raise TokMemError(f"--dataset {self.dataset} runs the {' and '.join(REAL_DATA_STUDIES)} studies, not {self.study}")
        return self

    def _with_tool_counts(self) -> "CompositionalConfig":
        """The built-in catalog or an xLAM file: the numbers of evaluation and adaptation tools, checked."""
        if self.test_data:
            raise TokMemError("--test-data needs --dataset complexfuncbench")
        adaptation, evaluation = (XLAM_TOOLS, XLAM_TOOLS) if self.xlam else map(len, split_tools())
        config = replace(self, tools=self.tools or evaluation, adapt_tools=self.adapt_tools or adaptation)
        if not self.xlam and (config.tools > evaluation or config.adapt_tools > adaptation):
            raise TokMemError(f"the built-in catalog has {evaluation} evaluation and {adaptation} adaptation tools; "
                              "pass --xlam for more")
        if config.study == "forgetting" and not 1 <= config.rounds <= config.tools // 2:
            raise TokMemError(f"cannot split {config.tools} tools into {config.rounds} rounds: "
                              "a round needs two tools or more to compose its test queries")
        return config


PRESETS = {
    # smollm2-135m on 2 CPU cores, the reference code's recipe (batch 2, orthogonal rows, warm-up + linear decay,
    # per-step renormalisation, arguments-only segments) at a tenth of its data: 10 evaluation tools, ~220 training
    # queries.  TokMem's rows train 10 epochs (~1,100 updates, 10× the earlier preset's 110); fine-tuning 2 epochs (it
    # learns faster, and 2 were enough for 91.5 tool F1 before).  LoRA's lrs are 20× the paper's for the small data.
    # The adaptation phase (1,000 queries over the 25 built-in adaptation tools, 1 epoch) is cached on disk; its LoRA
    # has no dropout here: on this CPU, dropout 0.1 made a step of 2 queries 5.8x slower (9.26 s against 1.60 s,
    # /tmp/time_adapt.py, 6 steps each, near-idle machine).
    "cpu": {
        "common": dict(
            backbone=DEFAULT_BACKBONE, tools=10, per_tool=12, train_multi=120, test_multi=40, adapt_per_tool=20,
            adapt_multi=500, max_new_tokens=176, epochs=2, tokmem_epochs=10, batch_size=2, lora_lr=1e-3, adapt_lr=1e-3,
            replay_buffer=100, init="orthogonal", schedule="linear", renorm_every_step=True, adapt_dropout=0.0,
        ),
        # four training caps, each trained afresh: TokMem 4 epochs (the recipe study's budget), not the main study's 10
        "generalization": dict(test_multi=32, tokmem_epochs=4),
        # 5 rounds of 2 tools, 42 training queries a round; TokMem's four variants at 4 epochs (84 updates a round,
        # 7–10 minutes a variant) so that the five methods fit the hour (measured: 43 min alone on 2 cores)
        "forgetting": dict(per_tool=14, train_multi=20, test_multi=8, tokmem_epochs=4),
        # four TokMem runs (as configured, then init, schedule and segments switched alone) at 4 epochs each, not the
        # main study's 10: ~10 minutes a variant, so the ablation fits the hour
        "recipe": dict(tokmem_epochs=4),
        # ComplexFuncBench's records with 2–4 calls (as the paper's queries): 150 to train, 24 to test; 300 BFCL
        # multi-turn turns to adapt.  Arguments-only sequences of these records reach ~320 tokens (p95), whole
        # calls a little more: max_length 512 keeps them whole.
        "complexfuncbench": dict(train_multi=150, test_multi=24, adapt_multi=300, tokmem_epochs=6, max_length=512,
                                 max_new_tokens=384),
    },
    # the paper's sizes and the reference code's recipe; a GPU (and, for 50 + 50 tools, the xLAM file: --xlam)
    "paper": {
        "common": dict(backbone="meta-llama/Llama-3.2-1B-Instruct", epochs=3, batch_size=2, init="orthogonal",
                       schedule="linear", renorm_every_step=True),
        "forgetting": dict(train_multi=1000, test_multi=100),
    },
}


def make_config(preset: str | None = "cpu", study: str = "main", **options) -> CompositionalConfig:
    """A preset's settings for the study, overridden by every option that is not None."""
    if preset is not None and preset not in PRESETS:
        raise TokMemError(f"unknown preset '{preset}': choose from {', '.join(PRESETS)}")
    sizes = PRESETS.get(preset, {})
    dataset = sizes.get(options.get("dataset") or "builtin", {})
    settings = {**sizes.get("common", {}), **sizes.get(study, {}), **dataset, **{k: v for k, v in options.items() if v is not None}}
    return CompositionalConfig(study=study, preset=preset, **settings)


# ---- data and backbones ------------------------------------------------------------------------------
def tool_data(config: CompositionalConfig, ranks: tuple[int, int], train_max_calls: int | None = None) -> ToolData:
    """Train and test queries over the evaluation tools ranked ``ranks`` (1-based, inclusive, among the evaluation
    tools: in an xLAM file they follow the adaptation tools, as in the reference code)."""
    if config.dataset == "complexfuncbench":
        return real_data(config).data
    sizes = dict(per_tool=config.per_tool, train_multi=config.train_multi, test_multi=config.test_multi,
                 max_calls=config.max_calls, train_max_calls=train_max_calls, seed=config.seed)
    if config.xlam:
        first, last = ranks
        return xlam_dataset(config.xlam, (config.adapt_tools + first, config.adapt_tools + last), **sizes)
    first, last = ranks
    return tool_dataset(split_tools()[1][first - 1 : last], **sizes)


def adaptation_examples(config: CompositionalConfig) -> list[Example]:
    """The adaptation phase's data: single and composed queries over the held-out adaptation tools."""
    if config.dataset == "complexfuncbench":
        return real_data(config).adaptation
    if config.xlam:
        ranks = (1, config.adapt_tools)
        return xlam_dataset(config.xlam, ranks, per_tool=config.adapt_per_tool, train_multi=config.adapt_multi, test_multi=0,
                            max_calls=config.max_calls, test_fraction=0.0, seed=config.seed).train
    tools = split_tools()[0][: config.adapt_tools]
    return tool_examples(tools, config.adapt_per_tool, config.adapt_multi, config.max_calls, config.seed)


@functools.lru_cache(maxsize=2)
def real_data(config: CompositionalConfig) -> RealData:
    """ComplexFuncBench to evaluate and BFCL multi-turn to adapt (``tokmem.data.realtools``), read once per config."""
    folder = function_calling_dir(config.data_dir)
    return complexfuncbench_data(folder, config.max_calls, config.test_fraction, config.train_multi, config.test_multi,
                                 config.adapt_multi, config.test_data, config.seed)


def groups(config: CompositionalConfig) -> list[tuple[int, int]]:
    """The forgetting study's rounds: ``rounds`` consecutive, near-equal groups of tool ranks."""
    cuts = [round(i * config.tools / config.rounds) for i in range(config.rounds + 1)]
    return [(first + 1, last) for first, last in zip(cuts, cuts[1:])]


def prepare_backbones(config: CompositionalConfig, backbone: Backbone | None, progress: bool) -> tuple[dict, dict | None]:
    """{"base": the backbone, "adapted": it after the adaptation phase (only when a method needs it)}, and
    what the adaptation did.  The adapted backbone is built once and cached on disk (``tokmem.adapt.cached_adapt``)."""
    base = backbone or load_backbone(config.backbone, device=config.device)
    if not ADAPTED & set(config.methods):
        return {"base": base}, None
    examples = adaptation_examples(config)
    lora = AdaptConfig(rank=config.lora_rank, dropout=config.adapt_dropout, lr=config.adapt_lr,
                       weight_decay=config.lora_weight_decay)
    rows = TrainConfig(lr=config.tokmem_lr, epochs=config.adapt_epochs, batch_size=config.batch_size,
                       max_length=config.max_length, seed=config.seed, init=config.init, schedule=config.schedule,
                       warmup=config.warmup, tool_segments=config.tool_segments, progress=progress)
    start = time.perf_counter()
    adapted, directory, cached = cached_adapt(base, examples, lora, rows, config.adapt_cache)
    info = {"tools": list(dict.fromkeys(p for e in examples for p in e.procedures)), "examples": len(examples),
            "steps": -(-len(examples) * config.adapt_epochs // config.batch_size), "directory": str(directory),
            "cached": cached, "seconds": round(time.perf_counter() - start, 1)}
    return {"base": base, "adapted": adapted}, info


def build_method(name: str, config: CompositionalConfig, backbones: dict, tools: dict[str, dict]) -> Method:
    """A fresh method; ``tools``: the schemas ICL and RAG may show."""
    base, adapted = backbones["base"], backbones.get("adapted")
    decode, lora = config.decode_options(), config.lora_options()
    memory = config.tokmem_options() | dict(max_steps=config.max_calls, name=name, label=TOKMEM_LABELS.get(name))
    replay = dict(ratio=config.replay_ratio, buffer_size=config.replay_buffer,
                  refresh_every=max(1, (config.tools or len(tools)) // config.rounds))
    factories = {
        "icl": lambda: ICL(base, tools, config.shots, **decode),
        "rag": lambda: ToolRAG(base, tools, config.rag_k, config.shots, **decode),
        "lora": lambda: LoRA(base, **lora),
        "replay": lambda: Replay(base, **replay, **lora),
        "tokmem-noadapt": lambda: TokMem(base, **memory),
        "tokmem": lambda: TokMem(adapted, **memory),
        "tokmem-roundnorm": lambda: TokMem(adapted, **memory | dict(renorm_every_step=False)),
        "tokmem-norenorm": lambda: TokMem(adapted, renormalize=False, **memory),
        "tokmem-unfrozen": lambda: UnfrozenTokMem(adapted, config.lora_rank, config.lora_lr, config.lora_weight_decay, **memory),
    }
    return factories[name]()


# ---- scoring ------------------------------------------------------------------------------------------
def evaluate(method: Method, examples: list[Example], batch_size: int, bar, samples: int = 3) -> dict:
    """Scores of the method's answers to ``examples``, its trainable parameters and a few answers to read."""
    start = time.perf_counter()
    bar.set_description_str(f"{method.name}: answering {len(examples)} queries")
    predictions = [predicted_calls(a) for a in answer_all(method, [e.query for e in examples], batch_size, bar)]
    return {
        "label": method.label,
        **score_calls(examples, predictions),
        "trainable_params": method.trainable_params(),
        "eval_seconds": round(time.perf_counter() - start, 2),
        "samples": answer_samples(examples[:samples], predictions),
    }


def answer_samples(examples: list[Example], predictions: list) -> list[dict]:
    """Queries with their gold and predicted calls, for a reader to see what the scores mean."""
    return [{"query": e.query, "gold": [s.response for s in e.steps], "predicted": [text for text, _ in p]}
            for e, p in zip(examples, predictions)]


def learn_and_evaluate(method: Method, data: ToolData, config: CompositionalConfig, bar) -> dict:
    seconds = learn_round(method, data.train, f"{len(data.train)} queries", bar)
    return evaluate(method, data.test, config.eval_batch_size, bar) | {"train_seconds": round(seconds, 2)}


# ---- the studies -----------------------------------------------------------------------------------------
def run(config: CompositionalConfig, backbone: Backbone | None = None, progress: bool = True, json_path=None) -> dict:
    """The study ``config.study`` names; ``json_path``: where to save the result so far after every step."""
    runners = {"main": run_main, "generalization": run_generalization, "forgetting": run_forgetting, "recipe": run_recipe}
    return runners[config.study](config, backbone, progress, json_path)


def run_main(config: CompositionalConfig, backbone=None, progress: bool = True, json_path=None) -> dict:
    config = config.resolved()
    data = tool_data(config, (1, config.tools))
    backbones, adaptation = prepare_backbones(config, backbone, progress)
    result = _start(config, [data], adaptation) | {"methods": {}}
    bar = progress_bar(sum(config.epochs_of(m) * len(data.train) + len(data.test) for m in config.methods), progress)
    for name in config.methods:
        method = build_method(name, config, backbones, data.tools)
        result["methods"][name] = learn_and_evaluate(method, data, config, bar)
        bar.write(summary_line(name, result["methods"][name]))
        _save(result, json_path)
    bar.close()
    return result


def run_generalization(config: CompositionalConfig, backbone=None, progress: bool = True, json_path=None) -> dict:
    config = config.resolved()
    datasets = {n: tool_data(config, (1, config.tools), train_max_calls=n) for n in config.train_max_calls}
    backbones, adaptation = prepare_backbones(config, backbone, progress)
    result = _start(config, list(datasets.values())[:1], adaptation) | {"train_max_calls": {}}
    result["data"]["train"] = {str(n): len(d.train) for n, d in datasets.items()}  # the test set is the same for every cap
    units = sum(config.epochs_of(m) * len(d.train) + len(d.test) for d in datasets.values() for m in config.methods)
    bar = progress_bar(units, progress)
    for n, data in datasets.items():
        point = result["train_max_calls"][str(n)] = {"methods": {}}
        for name in config.methods:
            point["methods"][name] = learn_and_evaluate(build_method(name, config, backbones, data.tools), data, config, bar)
            bar.write(f"trained on ≤ {n} calls: " + summary_line(name, point["methods"][name]))
            _save(result, json_path)
    bar.close()
    return result


def recipe_variants(config: CompositionalConfig) -> dict[str, dict]:
    """"as configured" and, for each recipe option, the config with that option switched to its alternative."""
    variants = {"as configured": {}}
    for name, values in ABLATION.items():
        other = next(v for v in values if v != getattr(config, name))
        variants[f"{name}: {other} (not {getattr(config, name)})"] = {name: other}
    return variants


def run_recipe(config: CompositionalConfig, backbone=None, progress: bool = True, json_path=None) -> dict:
    config = config.resolved()
    data = tool_data(config, (1, config.tools))
    backbones, adaptation = prepare_backbones(config, backbone, progress)
    variants = recipe_variants(config)
    result = _start(config, [data], adaptation) | {"variants": {}}
    bar = progress_bar(len(variants) * sum(config.epochs_of(m) * len(data.train) + len(data.test) for m in config.methods), progress)
    for label, change in variants.items():
        point = result["variants"][label] = {"change": change, "methods": {}}
        variant, variant_backbones = replace(config, **change), backbones
        if variant.tool_segments != config.tool_segments:  # the adaptation phase teaches the layout: adapt for this one
            variant_backbones, point["adaptation"] = prepare_backbones(variant, backbones["base"], progress)
        for name in config.methods:
            method = build_method(name, variant, variant_backbones, data.tools)
            point["methods"][name] = learn_and_evaluate(method, data, config, bar)
            bar.write(f"{label}: " + summary_line(name, point["methods"][name]))
            _save(result, json_path)
    bar.close()
    return result


def run_forgetting(config: CompositionalConfig, backbone=None, progress: bool = True, json_path=None) -> dict:
    config = config.resolved()
    datasets = [tool_data(config, ranks) for ranks in groups(config)]
    backbones, adaptation = prepare_backbones(config, backbone, progress)
    result = _start(config, datasets, adaptation) | {"groups": [list(d.tools) for d in datasets], "methods": {}}
    seen = [sum(len(d.test) for d in datasets[:r]) for r in range(1, len(datasets) + 1)]  # test queries after each round
    train = sum(len(d.train) for d in datasets)
    bar = progress_bar(sum(config.epochs_of(m) * train + sum(seen) for m in config.methods), progress)
    tools = {name: schema for d in datasets for name, schema in d.tools.items()}
    for name in config.methods:
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
    scores, samples = evaluate_groups(method, datasets[:r], config.eval_batch_size, bar)
    bar.write(f"{method.name} round {r}: argument F1 " + ", ".join(f"group {g} {s['arg_f1']['avg']:.1f}" for g, s in scores.items()))
    return {"round": r, "train_seconds": round(seconds, 2), "new_rows": new_row_norms(method, list(data.tools)),
            "groups": scores, "samples": samples}


def evaluate_groups(method: Method, datasets: list[ToolData], batch_size: int, bar) -> tuple[dict[str, dict], dict[str, list]]:
    """Scores on the test queries of each group (1-based), all answered together and then split, and each
    group's first answer: following one query over the rounds shows how an old tool's calls change."""
    queries = [e.query for d in datasets for e in d.test]
    bar.set_description_str(f"{method.name}: answering {len(queries)} queries")
    predictions = [predicted_calls(a) for a in answer_all(method, queries, batch_size, bar)]
    scores, samples, first = {}, {}, 0
    for g, data in enumerate(datasets, 1):
        predicted = predictions[first : first + len(data.test)]
        scores[str(g)], samples[str(g)] = score_calls(data.test, predicted), answer_samples(data.test[:1], predicted)
        first += len(data.test)
    return scores, samples


def new_row_norms(method: Method, names: list[str]) -> dict | None:
    """L2 norms of the memory rows of ``names`` after the round (TokMem only), their mean and spread."""
    if not isinstance(method, TokMem):
        return None
    bank = method.model.bank
    norms = [float(bank.index[bank.row(name)].norm()) for name in names]
    return {"norms": norms, "mean": metrics.mean(norms), "std": statistics.pstdev(norms)}


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
        test = f"tested on {config.test_data}" if config.test_data else f"split by query hash, {config.test_fraction:.0%} test"
        return f"ComplexFuncBench ({test}); BFCL v4 multi-turn to adapt"
    return config.xlam or "built-in catalog"


def _save(result: dict, json_path) -> None:
    if json_path:
        write_json_atomic(json_path, result)


def summary_line(name: str, scores: dict) -> str:
    return f"{name}: " + ", ".join(f"{title.lower()} {scores[metric]['avg']:.1f}" for metric, title in METRICS.items())


# ---- tables and plots ------------------------------------------------------------------------------------
def markdown(result: dict) -> str:
    writers = {"main": main_markdown, "generalization": generalization_markdown, "forgetting": forgetting_markdown,
               "recipe": recipe_markdown}
    return writers[result["study"]](result)


def plot(result: dict, path) -> Path:
    plotters = {"main": main_panels, "generalization": generalization_panels, "forgetting": forgetting_panels,
                "recipe": recipe_panels}
    columns = len(result["methods"]) if result["study"] == "forgetting" else None
    return line_plot(path, plotters[result["study"]](result), columns)


def write_outputs(result: dict, json_path) -> list[Path]:
    """The JSON, its markdown table (.md beside it) and its plot (.png beside it)."""
    json_path = Path(json_path)
    return [write_json_atomic(json_path, result), write_text_atomic(json_path.with_suffix(".md"), markdown(result)),
            plot(result, json_path.with_suffix(".png"))]


def _note(result: dict) -> str:
    config, data, adaptation = result["config"], result["data"], result["adaptation"]
    calls = ", ".join(f"{c} with {n} calls" for n, c in data["test_by_calls"].items())
    adapted = (f" The adaptation phase trained on {adaptation['examples']} queries over {len(adaptation['tools'])} held-out tools."
               if adaptation else "")
    train = data["train"]
    if isinstance(train, dict):
        train = f"{'/'.join(map(str, train.values()))} (capped at {'/'.join(train)} calls)"
    if "train_calls" in data:  # real data: how many calls its training records make, and what was left out
        train = f"{train} ({', '.join(f'{c} with {n} calls' for n, c in data['train_calls'].items())})"
        adapted += " Left out: " + "; ".join(f"{n} {why}" for why, n in data["left_out"].items()) + "."
    return (f"Backbone `{config['backbone']}`; {len(data['tools'])} tools ({data['source']}); {train} training "
            f"and {data['test']} test queries ({calls}); seed {config['seed']}.{adapted}\n\n{_protocol(config)}\n\n"
            "Tool F1: the tools called (TokMem's from its memory tokens); argument F1: the paper's, argument objects "
            "matched whatever the name; call F1: name and arguments both right. 0–100; Avg. is the mean over the "
            "numbers of calls.\n\n")


def _protocol(config: dict) -> str:
    """Which protocol the run followed: the reference code's recipe, or which parts of it differ."""
    reference = {"tool_segments": "arguments", "init": "orthogonal", "schedule": "linear", "renorm_every_step": True}
    differs = [f"{k} {config.get(k)}" for k, v in reference.items() if config.get(k, v) != v]
    epochs = f"TokMem {config.get('tokmem_epochs') or config['epochs']}, fine-tuning {config.get('lora_epochs') or config['epochs']}"
    recipe = ("Protocol: the reference code's (arguments-only tool segments, orthogonal rows, warm-up + linear decay, "
              "per-step renormalisation)" if not differs else "Protocol: ours, differing from the reference code in "
              + ", ".join(differs))
    return f"{recipe}; batch {config['batch_size']}; epochs: {epochs}."


def _calls(scores: dict) -> list[str]:
    return [key for key in scores["tool_f1"] if key != "avg"]


def _score_header(calls: list[str]) -> list[str]:
    return [f"{METRICS[m]} {c}" for m in METRICS for c in [*(f"{n} calls" for n in calls), "Avg."]]


def _score_cells(scores: dict, calls: list[str]) -> list[str]:
    return [f"{scores[m][c]:.1f}" if c in scores[m] else "–" for m in METRICS for c in [*calls, "avg"]]


def main_markdown(result: dict) -> str:
    """Table 3: methods (in the paper's order) × (tool, argument, call F1) × number of calls, with the trainable parameters."""
    methods = [result["methods"][m] for m in MAIN_METHODS if m in result["methods"]]
    calls = _calls(methods[0]) if methods else []
    rows = [[s["label"], f"{s['trainable_params']:,}", *_score_cells(s, calls)] for s in methods]
    return "# Compositional tool calling\n\n" + _note(result) + markdown_table(["Method", "#Params", *_score_header(calls)], rows)


def generalization_markdown(result: dict) -> str:
    """The paper's generalisation table: for each training cap on the number of calls, each method's scores."""
    points = result["train_max_calls"]
    first = next((s for p in points.values() for s in p["methods"].values()), None)
    calls = _calls(first) if first else []
    rows = [[f"≤ {n} calls ({result['data']['train'][n]} queries)", s["label"], *_score_cells(s, calls)]
            for n, p in points.items() for s in p["methods"].values()]
    return ("# Compositional generalisation\n\nTrained on queries with at most the given number of calls; tested on the same "
            "queries for every setting. " + _note(result) + markdown_table(["Train maximum calls", "Method", *_score_header(calls)], rows))


def recipe_markdown(result: dict) -> str:
    """One row per recipe variant and method: average F1s and the seconds it trained."""
    rows = [[label, s["label"], *(f"{s[m]['avg']:.1f}" for m in METRICS), f"{s['train_seconds']:.0f}"]
            for label, point in result["variants"].items() for s in point["methods"].values()]
    return ("# Training-recipe ablation\n\nEach row changes one option of the configured recipe "
            f"(init {result['config']['init']}, schedule {result['config']['schedule']}, tool segments "
            f"{result['config']['tool_segments']}) at the same budget. Renormalisation is not switched: a single round "
            "has no old rows to take the norm of (the forgetting study measures it). " + _note(result)
            + markdown_table(["Variant", "Method", *(f"{t} Avg." for t in METRICS.values()), "Train s"], rows))


def recipe_panels(result: dict) -> list[Panel]:
    """Average F1 per variant (numbered in the table's order), one line per method."""
    panels = []
    for metric, title in METRICS.items():
        series: dict[str, dict] = {}
        for k, point in enumerate(result["variants"].values()):
            for scores in point["methods"].values():
                series.setdefault(scores["label"], {})[k] = scores[metric]["avg"]
        panels.append(Panel(f"{title} (avg.)", "variant (row of the table, 0 = as configured)", "F1", lines(series), ylim=(0, 100)))
    return panels


def _group_series(entry: dict, metric: str) -> dict[str, dict]:
    """"group g" → {round: the group's score}, and "all seen groups" → {round: their mean}."""
    series: dict[str, dict] = {}
    for point in entry["rounds"]:
        for group, scores in point["groups"].items():
            series.setdefault(f"group {group}", {})[point["round"]] = scores[metric]["avg"]
    rounds = {p["round"]: p["groups"].values() for p in entry["rounds"]}
    return series | {"all seen groups": {r: metrics.mean(s[metric]["avg"] for s in seen) for r, seen in rounds.items()}}


def forgetting_markdown(result: dict) -> str:
    """Per method and metric: each group's score (rows) after each round (columns); then the new rows' norms."""
    rounds = list(range(1, result["config"]["rounds"] + 1))
    groups_text = "; ".join(f"group {g}: {', '.join(tools)}" for g, tools in enumerate(result["groups"], 1))
    out = f"# Forgetting: tools arriving in {len(rounds)} rounds\n\n{groups_text}.\n\n" + _note(result)
    for metric, title in METRICS.items():
        for entry in result["methods"].values():
            out += f"## {title}: {entry['label']}\n\n" + pivot_table(_group_series(entry, metric), rounds, corner="Group \\ round")
            out += "\n"
    norms = _new_rows(result)
    if norms:
        rows = [[label, *(f"{n['mean']:.3f} ± {n['std']:.3f}" for n in per_round)] for label, per_round in norms.items()]
        out += "## L2 norm of each round's new memory rows (mean ± std)\n\n" + markdown_table(["Method", *map(str, rounds)], rows)
    return out + _first_group_answers(result)


def _first_group_answers(result: dict) -> str:
    """Group 1's first test query as each method answers it after each round: what forgetting looks like."""
    answers = [(e["label"], p["round"], p["samples"]["1"][0]) for e in result["methods"].values() for p in e["rounds"]]
    if not answers:
        return ""
    sample = answers[0][2]
    out = f"\n## Group 1's first test query, answered after each round\n\nQuery: {sample['query']}\n\nGold: {_calls_text(sample['gold'])}\n\n"
    return out + "".join(f"- {label}, round {r}: {_calls_text(a['predicted'])}\n" for label, r, a in answers)


def _calls_text(calls: list[str]) -> str:
    return "; ".join(f"`{c}`" for c in calls) or "(no call)"


def _new_rows(result: dict) -> dict[str, list[dict]]:
    """label → the norms of each round's new memory rows, for the methods that have memory rows."""
    return {e["label"]: [p["new_rows"] for p in e["rounds"]] for e in result["methods"].values()
            if e["rounds"] and e["rounds"][0]["new_rows"]}


def main_panels(result: dict) -> list[Panel]:
    """F1 against the number of calls, one line per method."""
    panels = []
    for metric, title in METRICS.items():
        series = {s["label"]: {int(c): s[metric][c] for c in _calls(s)} for s in result["methods"].values()}
        panels.append(Panel(title, "number of calls", "F1", lines(series), ylim=(0, 100)))
    return panels


def generalization_panels(result: dict) -> list[Panel]:
    """Average F1 (2–4 calls) against the training cap on the number of calls, one line per method."""
    panels = []
    for metric, title in METRICS.items():
        series: dict[str, dict] = {}
        for n, point in result["train_max_calls"].items():
            for scores in point["methods"].values():
                series.setdefault(scores["label"], {})[int(n)] = scores[metric]["avg"]
        panels.append(Panel(f"{title} (avg.)", "maximum calls in training", "F1", lines(series), ylim=(0, 100)))
    return panels


def forgetting_panels(result: dict) -> list[Panel]:
    """A row per metric, a panel per method: each group's score over the rounds.  Then the new rows' mean
    norms (the paper finds them inflating round after round without renormalisation)."""
    panels = [Panel(f"{entry['label']}: {title}", "round", title, lines(_group_series(entry, metric)), ylim=(0, 100))
              for metric, title in METRICS.items() for entry in result["methods"].values()]
    norms = {label: {r: n["mean"] for r, n in enumerate(per_round, 1)} for label, per_round in _new_rows(result).items()}
    if norms:
        panels.append(Panel("New memory rows", "round", "mean L2 norm", lines(norms), ylim=(0, None)))
    return panels
