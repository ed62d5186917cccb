"""The compositional studies' setup: their data (built-in catalog, xLAM, real data), the backbones (the
adaptation phase, cached) and the methods each study builds."""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import replace

from tokmem.training.adapt import cached_adapt
from tokmem.backbones import Backbone, load_backbone
from tokmem.data.procedures import Example
from tokmem.data.tool_catalog import split_tools
from research.studies.realtools import RealData, complexfuncbench_data, function_calling_dir
from tokmem.data.tool_datasets import ToolData, tool_dataset, tool_examples, xlam_dataset
from tokmem.eval import metrics
from tokmem.eval.steps import gold_value_sources
from research.methods.lora import LoRA, Replay, ReplaySettings
from research.methods.method import Method
from research.methods.native import NativeTools
from research.methods.tokmem import TokMem, UnfrozenTokMem
from research.methods.tools import ICL, ToolRAG
from research.studies.compositional_config import LORA_ADAPTED, CompositionalConfig
from tokmem.training.train import LOSS_WEIGHTS, RENORM_SETTINGS, TrainConfig

TOKMEM_LABELS = {
    "tokmem-noadapt": "TokMem (w/o adapt)",
    "tokmem": "TokMem (w/ adapt)",
    "tokmem-better": "TokMem (w/ adapt; mean init, constant lr)",
    "tokmem-noschema": "TokMem (w/ adapt; free arguments)",
    "tokmem-roundnorm": "TokMem (renorm after round)",
    "tokmem-norenorm": "TokMem (w/o renorm)",
    "tokmem-unfrozen": "TokMem (unfrozen backbone)",
}
ADAPTED = {
    "tokmem",
    "tokmem-better",
    "tokmem-noschema",
    "tokmem-roundnorm",
    "tokmem-norenorm",
    "tokmem-unfrozen",
    LORA_ADAPTED,
}
# the recipe study's better defaults (--init mean --lr-schedule constant)
BETTER_RECIPE = dict(init="mean", schedule="constant")


def tool_data(config: CompositionalConfig, ranks: tuple[int, int], train_max_calls: int | None = None) -> ToolData:
    """Train and test queries over the evaluation tools ranked ``ranks`` (1-based, inclusive, among the evaluation
    tools: in an xLAM file they follow the adaptation tools, as in the reference code)."""
    if config.dataset == "complexfuncbench":
        return real_data(config).data
    sizes = dict(
        per_tool=config.per_tool,
        train_multi=config.train_multi,
        test_multi=config.test_multi,
        max_calls=config.max_calls,
        train_max_calls=train_max_calls,
        seed=config.seed,
    )
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
        return xlam_dataset(
            config.xlam,
            ranks,
            per_tool=config.adapt_per_tool,
            train_multi=config.adapt_multi,
            test_multi=0,
            max_calls=config.max_calls,
            test_fraction=0.0,
            seed=config.seed,
        ).train
    tools = split_tools()[0][: config.adapt_tools]
    return tool_examples(tools, config.adapt_per_tool, config.adapt_multi, config.max_calls, config.seed)


@functools.lru_cache(maxsize=2)
def real_data(config: CompositionalConfig) -> RealData:
    """ComplexFuncBench to evaluate and ``adapt_data`` to adapt (``research.studies.realtools``), read once per config."""
    folder = function_calling_dir(config.data_dir)
    real = complexfuncbench_data(
        folder,
        max_calls=config.max_calls,
        test_fraction=config.test_fraction,
        train_size=config.train_multi,
        test_size=config.test_multi,
        adapt_samples=config.adapt_multi,
        test_data=config.test_data,
        seed=config.seed,
        results=config.results_in_context,
        test_spec=config.test_spec,
        adapt_data=config.adapt_data,
        split=config.split,
        dev_fraction=config.dev_fraction,
    )
    return real.with_named_results() if config.name_results else real


def groups(config: CompositionalConfig) -> list[tuple[int, int]]:
    """The forgetting study's rounds: ``rounds`` consecutive, near-equal groups of tool ranks."""
    cuts = [round(i * config.tools / config.rounds) for i in range(config.rounds + 1)]
    return [(first + 1, last) for first, last in zip(cuts, cuts[1:])]


def adaptation_rows(config: CompositionalConfig) -> TrainConfig:
    """How the adaptation phase trains its temporary rows (and, by the same schedule, the LoRA weights): as the
    study's methods train, for ``adapt_epochs``.  The rows are dropped after the phase, never renormalised, and have no
    schemas, so no key order binds them (adaptations cached before keep their key); the phase is the same whatever
    the new rows' loss weights and renormalisation."""
    return replace(
        config.train(),
        epochs=config.adapt_epochs,
        key_order=TrainConfig.key_order,
        **{name: getattr(TrainConfig, name) for name in (*LOSS_WEIGHTS, *RENORM_SETTINGS)},
    )


def prepare_backbones(
    config: CompositionalConfig, backbone: Backbone | None, progress: bool
) -> tuple[dict, dict | None]:
    """{"base": the backbone, "adapted": it after the adaptation phase (only when a method needs it)}, and
    what the adaptation did.  The adapted backbone is built once and cached on disk (``tokmem.adapt.cached_adapt``)."""
    base = backbone or load_backbone(config.backbone, device=config.device)
    if not ADAPTED & set(config.methods):
        return {"base": base}, None
    examples = adaptation_examples(config)
    rows = replace(adaptation_rows(config), progress=progress)
    start = time.perf_counter()
    adapted, directory, cached = cached_adapt(base, examples, config.adaptation(), rows, config.adapt_cache)
    info = {
        "tools": list(dict.fromkeys(p for e in examples for p in e.procedures)),
        "examples": len(examples),
        "value_sources": gold_value_sources(examples),  # what the adaptation teaches to copy
        "steps": -(-len(examples) * config.adapt_epochs // config.batch_size),
        "trainable_params": config.adaptation().parameter_count(base.model),  # the adapter merged into the backbone
        "directory": str(directory),
        "cached": cached,
        "seconds": round(time.perf_counter() - start, 1),
    }
    return {"base": base, "adapted": adapted}, info


def build_method(name: str, config: CompositionalConfig, backbones: dict, tools: dict[str, dict]) -> Method:
    """A fresh method; ``tools``: the schemas ICL, RAG and native tool calling may show (and, in the tool loop,
    TokMem's rows keep)."""
    base, adapted = backbones["base"], backbones.get("adapted")
    train, decode, lora = config.train(), config.decode(), config.lora()
    schemas = {n: t.get("parameters") for n, t in tools.items()} if config.tool_loop() else None
    label = TOKMEM_LABELS.get(name)
    label = f"{label[:-1]}; schema shown)" if label and config.show_schemas else label
    memory = dict(decode=decode, name=name, label=label, schemas=schemas, decoupled=config.decoupled)
    memory |= dict(
        shows_schemas=config.show_schemas, memory_tokens=config.memory_tokens, shared_tokens=config.shared_tokens
    )
    refresh_every = max(1, (config.tools or len(tools)) // config.rounds)
    replay = ReplaySettings(config.replay_ratio, config.replay_buffer, refresh_every)
    factories = {
        "icl": lambda: ICL(base, tools, config.shots, decode),
        "rag": lambda: ToolRAG(base, tools, config.rag_k, config.shots, decode=decode),
        "native": lambda: NativeTools(base, tools, decode=decode),
        "native-retrieved": lambda: NativeTools(base, tools, config.rag_k, decode=decode),
        "lora": lambda: LoRA(base, train, lora, decode),
        LORA_ADAPTED: lambda: LoRA(adapted, train, lora, decode, LORA_ADAPTED, "Fine-tuning (w/ adapt)"),
        "replay": lambda: Replay(base, replay, train=train, lora=lora, decode=decode),
        "tokmem-noadapt": lambda: TokMem(base, train, **memory),
        "tokmem": lambda: TokMem(adapted, train, **memory),
        "tokmem-better": lambda: TokMem(adapted, replace(train, **BETTER_RECIPE), **memory),
        "tokmem-noschema": lambda: TokMem(adapted, train, **memory | dict(decode=replace(decode, schema=False))),
        "tokmem-roundnorm": lambda: TokMem(adapted, replace(train, renorm_every_step=False), **memory),
        "tokmem-norenorm": lambda: TokMem(adapted, replace(train, renormalize=False), **memory),
        "tokmem-unfrozen": lambda: UnfrozenTokMem(adapted, lora, train=train, **memory),
    }
    return factories[name]()


def new_row_norms(method: Method, names: list[str]) -> dict | None:
    """L2 norms of the memory rows of ``names`` after the round (TokMem only; a decoupled bank's steer rows' mean
    apart), their mean and spread, beside the backbone's mean token-embedding norm (an ordinary token's size, to set
    the rows against)."""
    if not isinstance(method, TokMem):
        return None
    bank = method.model.bank
    rows = [bank.row(name) for name in names]
    norms = bank.norms("index")[rows].tolist()
    steer = {"steer_mean": metrics.mean(bank.norms("steer")[rows].tolist())} if bank.decoupled else {}
    return {
        "norms": norms,
        "mean": metrics.mean(norms),
        "std": statistics.pstdev(norms),
        **steer,
        "token_norm": method.model.backbone.embedding_norm(),
    }
