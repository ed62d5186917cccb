"""The compositional studies' config: every setting of a run, checked (``resolved``), and the presets
(`research.studies.compositional` runs them)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Literal

from tokmem.training.adapt import AdaptConfig
from tokmem.bank.memory_bank import MEMORY_TOKENS, SHARED_TOKENS
from tokmem.config import config_from, option, option_of
from tokmem.data.tool_catalog import split_tools
from tokmem.decoding.decode import DecodeConfig
from tokmem.errors import TokMemError
from research.methods.tools import SHOTS, TOOLS_RETRIEVED
from research.studies.realtools import ADAPT_DATA, DEV_FRACTION, SPLITS, check_adapt_data
from research.studies.settings import Layer, MethodSettings, preset_settings
from tokmem.data.tool_datasets import StudySizes

MAIN_METHODS = ("icl", "rag", "lora", "tokmem-noadapt", "tokmem", "tokmem-better")
LOOP_ABLATION = "tokmem-noschema"  # TokMem (w/ adapt) decoding free arguments: the tool loop's ablation row
NATIVE_METHODS = ("native", "native-retrieved")  # the backbone's own tool calling (a template with tool support)
LORA_ADAPTED = "lora-adapted"  # fine-tuning on the backbone TokMem (w/ adapt) trains on: the adaptation for both
STUDIES = {  # study → (default methods, methods it accepts)
    "main": (MAIN_METHODS, (*MAIN_METHODS, *NATIVE_METHODS, LOOP_ABLATION, LORA_ADAPTED)),
    "generalization": (("lora", "tokmem"), MAIN_METHODS),
    "recipe": (("tokmem",), ("tokmem", "tokmem-noadapt")),
    "forgetting": (
        ("replay", "tokmem", "tokmem-roundnorm", "tokmem-norenorm", "tokmem-unfrozen"),
        (
            "lora",
            "replay",
            "tokmem-noadapt",
            "tokmem",
            "tokmem-better",
            "tokmem-roundnorm",
            "tokmem-norenorm",
            "tokmem-unfrozen",
        ),
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
        None,
        "comma-separated methods (main: icl,rag,lora,tokmem-noadapt,tokmem, also native,native-retrieved: the "
        "backbone's own tool calling, and lora-adapted: fine-tuning on TokMem's adapted backbone; generalization: lora,tokmem; "
        "forgetting: replay,tokmem,tokmem-roundnorm,tokmem-norenorm,tokmem-unfrozen, also lora,tokmem-noadapt,"
        "tokmem-better)",
    )
    xlam: str | None = option(None, "an xLAM / APIGen JSON file (default: the built-in 25 + 25 tool catalog)")
    dataset: str = option(
        "builtin",
        "builtin or complexfuncbench: ComplexFuncBench's tools to evaluate, BFCL "
        "multi-turn's to adapt (real data; main and recipe studies)",
    )
    data_dir: str | None = option(
        None,
        "complexfuncbench: the folder with complexfuncbench/ and bfcl/ (default: "
        "function-calling in the shared data, tokmem.data.shared)",
    )
    test_data: str | None = option(
        None, "complexfuncbench: a NESTFUL file to test on (your own split) instead of the query-hash split"
    )
    test_spec: str | None = option(
        None, "complexfuncbench: the spec file (tool schemas) of --test-data (default: X-spec.json beside X-data.json)"
    )
    decoupled: bool = option(
        False, "TokMem's banks decoupled (the paper's DC variant): index rows are routed on, steer rows are read"
    )
    results_in_context: bool = option(
        True,
        "complexfuncbench: each call's recorded result follows it in training and in the contexts answered, "
        "references in gold arguments resolved to their values; evaluation per step and end to end",
    )
    name_results: bool = option(
        False,
        "complexfuncbench: each tool result opens with its tool's name ([Search_Hotels] …), for every method, in "
        "training, adapting and the contexts answered (a memory token hides the name of the call it stands for)",
    )
    test_fraction: float = option(0.2, "complexfuncbench: share of records the query-hash split tests on")
    dev_fraction: float = option(
        DEV_FRACTION, "complexfuncbench: share of records the query-hash split holds out as the development split"
    )
    split: Literal["dev", "test"] | None = option(
        None,
        "complexfuncbench: the held-out records answered: dev (the default; every choice is made on it) or test "
        "(read once, with a recipe frozen in a --preset-file); research.studies.realtools says how records split",
    )
    preset_file: str | None = option(
        None,
        "a JSON file of settings: a recipe frozen (and committed) before a test run, applied over --preset; the "
        "command line may add settings, not change the file's; the result records its path and SHA-256",
    )
    preset_sha256: str | None = None  # of --preset-file's bytes, set where it is read (``make_config``)
    adapt_data: tuple[str, ...] = option(
        ADAPT_DATA,
        "complexfuncbench: the adaptation phase's data, some of bfcl (BFCL multi-turn turns, no results), "
        "bfcl-executed (the same turns, each call run on BFCL's simulated backends: with results), "
        "flights (ComplexFuncBench's records over its flight tools, with results; those tools then leave the "
        "evaluation), chains (the default: --adapt-multi synthetic records whose later calls read earlier results: "
        "tokmem.data.tool_chains) and study (the study's own training records: a diagnostic, the evaluation's own "
        "tools)",
    )
    tools: int | None = option(None, "evaluation tools (default: all 25 built-in, or 50 from --xlam)")
    adapt_tools: int | None = option(None, "adaptation tools (likewise)")
    per_tool: int = option(StudySizes.per_tool, "single-tool samples per tool")
    train_multi: int = option(
        StudySizes.train_multi, "composed training queries (forgetting: per round; complexfuncbench: training records)"
    )
    test_multi: int | None = option(
        StudySizes.test_multi,
        "composed test queries (forgetting: per round; complexfuncbench: the first records of --split dev)",
    )
    max_calls: int = option(
        StudySizes.max_calls, "most calls in a query (complexfuncbench: longer records are left out and counted)"
    )
    end_to_end: bool = option(
        True,
        "the tool loop: answer end to end too (each method's own earlier calls), not per step only (a dev sweep "
        "decides on the per-step scores: --no-end-to-end halves its answering)",
    )
    adapt_per_tool: int = option(StudySizes.per_tool, "single-tool samples per adaptation tool")
    adapt_multi: int = option(
        3750,
        "composed adaptation queries (with 50 single-tool samples of each of 25 tools: "
        "the reference's 5,000 samples; complexfuncbench: BFCL multi-turn turns and synthetic chains)",
    )
    train_max_calls: tuple[int, ...] = option((1, 2, 3, 4), "generalization: caps on the calls of a training query")
    rounds: int = option(5, "forgetting: rounds (groups of tools)")
    adapt_epochs: int = option(1, "epochs of the adaptation phase")
    max_new_tokens: int = option_of(
        DecodeConfig, "max_new_tokens", "tokens an answer may generate (four calls with long arguments)", default=512
    )
    adapt_lr: float = option_of(
        AdaptConfig,
        "lr",
        "learning rate of the adaptation phase's LoRA (rank --lora-rank, alpha 32, as the reference's)",
    )
    adapt_dropout: float = option_of(
        AdaptConfig, "dropout", "dropout of the adaptation phase's LoRA (0 is several times faster on CPU)"
    )
    adapt_cache: str | None = option(None, "directory of cached adapted backbones (default <tokmem cache>/adapted)")
    rag_k: int = option(TOOLS_RETRIEVED, "tools RAG and native-retrieved retrieve")
    shots: int = option(SHOTS, "demonstrations ICL and RAG show")
    replay_buffer: int = option(1000, "examples the replay buffer keeps")
    show_schemas: bool = option(
        False,
        "tokmem+schema: TokMem's banks show the chosen tool's schema between its memory token and its arguments "
        "(trained and decoded so; the tool loop only)",
    )
    memory_tokens: int = option(
        MEMORY_TOKENS,
        "TokMem's memory tokens a tool: the first routes, the others (its tail) follow it as context for the "
        "arguments (the tool loop only)",
    )
    shared_tokens: int = option(
        SHARED_TOKENS,
        "rows every tool of TokMem's banks reads after its own memory tokens, trained on all the tools' calls in the "
        "bank's first round (the tool loop only)",
    )

    def resolved(self) -> "CompositionalConfig":
        """Fill the defaults that depend on the study and the data; check the rest."""
        if self.study not in STUDIES:
            raise TokMemError(f"unknown study '{self.study}': choose from {', '.join(STUDIES)}")
        if self.dataset not in DATASETS:
            raise TokMemError(
                f"unknown dataset '{self.dataset}': choose from {', '.join(DATASETS)} (or pass --xlam FILE)"
            )
        defaults, accepted = STUDIES[self.study]
        if self.study == "main" and self.tool_loop():
            # its ablation row; not "tokmem-better": that recipe (constant lr) is the one routing collapsed under here
            defaults = (*(m for m in defaults if m != "tokmem-better"), LOOP_ABLATION)
        unknown = [m for m in self.methods or defaults if m not in accepted]
        if unknown:
            raise TokMemError(
                f"the {self.study} study cannot run {', '.join(unknown)}: choose from {', '.join(accepted)}"
            )
        config = replace(self, methods=tuple(self.methods or defaults))
        chosen_flags = (
            ("--show-schemas", self.show_schemas),
            ("--name-results", self.name_results),
            ("--memory-tokens", self.memory_tokens != MEMORY_TOKENS),
            ("--shared-tokens", self.shared_tokens != SHARED_TOKENS),
        )
        for flag, chosen in chosen_flags:
            if chosen and not self.tool_loop():
                raise TokMemError(f"{flag} answers in the tool loop only (complexfuncbench, results in context)")
        return config._checked_real() if self.dataset != "builtin" else config._with_tool_counts()

    def decode(self) -> DecodeConfig:
        """TokMem chains up to ``max_calls`` memory tokens: one call each."""
        return replace(super().decode(), max_steps=self.max_calls)

    def adaptation(self) -> AdaptConfig:
        """The adaptation phase's LoRA: fine-tuning's rank and weight decay, its own lr and dropout; its temporary
        rows in the layout TokMem's will have: as many rows after each memory token (``memory_tokens``, then
        ``shared_tokens``; the temporary rows are each tool's own, the adapted backbone learns the layout)."""
        lora = dict(rank=self.lora_rank, weight_decay=self.lora_weight_decay)
        return config_from(self, AdaptConfig, **lora, memory_tokens=self.memory_tokens + self.shared_tokens)

    def tool_loop(self) -> bool:
        """Whether the study measures the tool loop (results in context; ``research.studies.tool_loop``)."""
        return self.dataset == "complexfuncbench" and self.results_in_context

    def _checked_real(self) -> "CompositionalConfig":
        if self.xlam:
            raise TokMemError(f"--xlam and --dataset {self.dataset} are two data sources: pass one")
        if self.study not in REAL_DATA_STUDIES:
            raise TokMemError(
                f"--dataset {self.dataset} runs the {' and '.join(REAL_DATA_STUDIES)} studies, not {self.study}"
            )
        if self.test_spec and not self.test_data:
            raise TokMemError("--test-spec is the spec of --test-data: pass both")
        if self.split not in SPLITS:
            raise TokMemError(f"--split {self.split}: choose from {', '.join(SPLITS)}")
        if self.split == "test" and not self.preset_sha256:
            raise TokMemError(
                "--split test reads the test once, with a recipe frozen before: pass --preset-file FILE (a committed "
                "JSON of the settings chosen on --split dev)"
            )
        check_adapt_data(self.adapt_data)
        return self

    def _with_tool_counts(self) -> "CompositionalConfig":
        """The built-in catalog or an xLAM file: the numbers of evaluation and adaptation tools, checked."""
        if self.test_data or self.test_spec or self.adapt_data != ADAPT_DATA or self.split:
            raise TokMemError("--test-data, --test-spec, --adapt-data and --split need --dataset complexfuncbench")
        adaptation, evaluation = (XLAM_TOOLS, XLAM_TOOLS) if self.xlam else map(len, split_tools())
        config = replace(self, tools=self.tools or evaluation, adapt_tools=self.adapt_tools or adaptation)
        if not self.xlam and (config.tools > evaluation or config.adapt_tools > adaptation):
            raise TokMemError(
                f"the built-in catalog has {evaluation} evaluation and {adaptation} adaptation tools; "
                "pass --xlam for more"
            )
        if config.study == "forgetting" and not 1 <= config.rounds <= config.tools // 2:
            raise TokMemError(
                f"cannot split {config.tools} tools into {config.rounds} rounds: "
                "a round needs two tools or more to compose its test queries"
            )
        return config


QWEN_05B = "qwen2.5-coder-0.5b"
PRESETS = {
    # smollm2-135m on 2 CPU cores, the reference code's recipe (batch 2, orthogonal rows, warm-up + linear decay,
    # per-step renormalisation, arguments-only segments) at a tenth of its data: 10 evaluation tools, ~220 training
    # queries.  Every trained method trains the same epochs: two budgets, the paper's one epoch and a longer one (a
    # budget curve).  LoRA's lrs are 20x the paper's for the small data.  The adaptation phase (1,000 queries over the
    # 25 built-in adaptation tools, 1 epoch) is cached on disk; its LoRA has no dropout (dropout is slow on a CPU).
    "cpu": (
        Layer(
            dict(
                tools=10,
                per_tool=12,
                train_multi=120,
                test_multi=40,
                adapt_per_tool=20,
                adapt_multi=500,
                max_new_tokens=176,
                epochs=1,
                epoch_budgets=(1, 4),
                batch_size=2,
                lora_lr=1e-3,
                adapt_lr=1e-3,
                replay_buffer=100,
                init="orthogonal",
                schedule="linear",
                renorm_every_step=True,
                adapt_dropout=0.0,
            )
        ),
        # four training caps, each trained afresh: a long budget of 3 epochs
        Layer(dict(test_multi=32, epoch_budgets=(1, 3)), when=dict(study="generalization")),
        # 5 rounds of 2 tools, 42 training queries a round
        Layer(dict(per_tool=14, train_multi=20, test_multi=8), when=dict(study="forgetting")),
        # four TokMem runs (as configured, then init, schedule and segments switched alone), all at one budget
        Layer(dict(epochs=4, epoch_budgets=None), when=dict(study="recipe")),
        # ComplexFuncBench's records with 2-4 calls (as the paper's queries): 120 to train, every record of the split
        # answered (realtools: dev or test); 120 synthetic tool chains to adapt (the size measured).  With each call's
        # result in context the sequences grow: max_length 1536 keeps them whole.  One budget of 2 epochs.  Rows
        # mean-initialised and a decaying schedule at 2e-2 (the recipe study and research/scripts/routing_budget.py say
        # why).  A call is one answer: 160 new tokens.
        Layer(
            dict(
                train_multi=120,
                test_multi=None,
                adapt_multi=120,
                epochs=2,
                epoch_budgets=None,
                max_length=1536,
                max_new_tokens=160,
                init="mean",
                schedule="linear",
                tokmem_lr=2e-2,
            ),
            when=dict(dataset="complexfuncbench"),
        ),
        # the same on Qwen2.5-Coder-0.5B, whose calls take more tokens
        Layer(dict(max_new_tokens=256), when=dict(dataset="complexfuncbench", backbone=QWEN_05B)),
        # tokmem+schema: each call's schema in context as well: 2432 keeps every training record whole at seeds 0-2
        # (the longest: 2343 tokens on smollm2, 2168 on the 0.5B; at 1536, 72 of the 0.5B's 120 were cut, 61 down to
        # one query token: tests/test_shown_schemas.py)
        Layer(dict(max_length=2432), when=dict(dataset="complexfuncbench", show_schemas=True)),
    ),
    # the paper's sizes and the reference code's recipe; a GPU (and, for 50 + 50 tools, the xLAM file: --xlam)
    "paper": (
        Layer(
            dict(
                backbone="meta-llama/Llama-3.2-1B-Instruct",
                epochs=1,
                epoch_budgets=(1, 3),
                batch_size=2,
                init="orthogonal",
                schedule="linear",
                renorm_every_step=True,
            )
        ),
        Layer(dict(train_multi=1000, test_multi=100), when=dict(study="forgetting")),
    ),
}


# under every preset (and none): a ComplexFuncBench run answers the development split unless told otherwise
UNDER = (Layer(dict(split="dev"), when=dict(dataset="complexfuncbench")),)
NOT_IN_PRESET_FILES = ("study", "preset", "preset_file", "preset_sha256")  # given beside the file, or set from it


def make_config(preset: str | None = "cpu", study: str = "main", **options) -> CompositionalConfig:
    """A preset's settings for the study (over ``UNDER``), then those of ``preset_file`` (``frozen_settings``),
    overridden by every other option that is not None (`settings.preset_settings`)."""
    frozen = frozen_settings(options.get("preset_file"), options)
    settings = preset_settings(PRESETS, preset, CompositionalConfig, {"study": study, **options, **frozen}, UNDER)
    return CompositionalConfig(preset=preset, **settings)


def frozen_settings(path: str | None, options: dict) -> dict:
    """The settings a preset file freezes (a JSON object of the config's fields) and its SHA-256 (``preset_sha256``),
    so that a result says which recipe it ran; an option given that changes one of them is refused (the recipe of a
    test run is the file's, chosen before the run)."""
    if path is None:
        return {}
    try:
        data = Path(path).read_bytes()
        settings = json.loads(data)
    except (OSError, ValueError) as error:
        raise TokMemError(f"--preset-file {path}: {error}") from None
    known = {f.name for f in fields(CompositionalConfig)} - set(NOT_IN_PRESET_FILES)
    unknown = sorted(set(settings) - known) if isinstance(settings, dict) else ["(not a JSON object)"]
    if unknown:
        raise TokMemError(f"--preset-file {path}: not settings of the study: {', '.join(unknown)}")
    settings = {key: tuple(value) if isinstance(value, list) else value for key, value in settings.items()}
    changed = sorted(key for key, value in options.items() if value is not None and settings.get(key, value) != value)
    if changed:
        raise TokMemError(f"--preset-file {path} sets {', '.join(changed)}: leave those options unset")
    return settings | {"preset_sha256": hashlib.sha256(data).hexdigest()}
