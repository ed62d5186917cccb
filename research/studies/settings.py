"""The settings the atomic and compositional studies share: how their methods train and answer; and the one shape of
every study's presets.

Each study's config inherits them and adds its data, its methods and the defaults of its own.  Each setting is a
field of `TrainConfig`, `DecodeConfig` or `LoRASettings` under the study's option name (``tokmem_lr`` is a
TrainConfig's ``lr``: `tokmem.config.option_of`), with that config's default, and the methods get those objects
(``train``, ``decode``, ``lora``).  Every trained method of a run trains the same number of epochs
(``epochs``): methods are compared at equal budgets by construction.

A preset is data: a tuple of `Layer`s, each some settings and the choices it applies under (the study, the dataset,
the backbone: ``--preset cpu --backbone qwen2.5-coder-0.5b`` picks the layers sized for that backbone); the layers that
apply are merged in order, then every option given overrides them (``preset_settings``).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields

from tokmem.backbones import backbone_option, device_option
from tokmem.config import config_from, option, option_of
from tokmem.decoding.decode import DecodeConfig
from tokmem.errors import TokMemError
from tokmem.training.lora import LoRASettings
from research.methods.lora import ReplaySettings
from tokmem.training.train import Init, KeyOrder, RenormSide, RenormTarget, Schedule, ToolSegments, TrainConfig

T, D, L, R = TrainConfig, DecodeConfig, LoRASettings, ReplaySettings


@dataclass(frozen=True)
class Layer:
    """Settings of a preset, and the choices they apply under (``{}``: always; ``{"study": "main"}``,
    ``{"dataset": "complexfuncbench", "backbone": "qwen2.5-coder-0.5b"}``: when every one of them is chosen)."""

    settings: dict
    when: dict = field(default_factory=dict)


Preset = tuple[Layer, ...]


def preset_settings(
    presets: dict[str, Preset], name: str | None, config: type, options: dict, under: Preset = ()
) -> dict:
    """The settings of preset ``name`` (None: none) over the layers ``under`` it (a study's, under every preset) for
    the choices made: each layer applies when its ``when`` matches the options given, else the settings so far, else
    ``config``'s defaults; then every option given overrides them (``overridden``)."""
    if name is not None and name not in presets:
        raise TokMemError(f"unknown preset '{name}': choose from {', '.join(presets)}")
    given = {key: value for key, value in options.items() if value is not None}
    settings = {}
    for layer in (*under, *presets.get(name, ())):
        chosen = _defaults(config) | settings | given
        if all(chosen.get(key) == value for key, value in layer.when.items()):
            settings |= layer.settings
    return overridden(settings, options)


def _defaults(config: type) -> dict:
    return {f.name: f.default for f in fields(config) if f.default is not MISSING}


def overridden(preset: dict, options: dict) -> dict:
    """A preset's settings overridden by every option that is not None.  ``epochs`` given alone is the run's one
    budget, so it replaces the preset's ``epoch_budgets`` (which would otherwise set every run's epochs and leave it
    unused); given with ``epoch_budgets`` it would be unused: an error."""
    given = {k: v for k, v in options.items() if v is not None}
    if "epochs" in given and "epoch_budgets" in given:
        raise TokMemError("--epochs and --epoch-budgets: give one (each budget is one run's --epochs)")
    settings = {**preset, **given}
    if "epochs" in given:
        settings.pop("epoch_budgets", None)
    return settings


@dataclass(frozen=True)
class MethodSettings:
    epochs: int = option_of(
        T,
        "epochs",
        "epochs of every trained method alike (the same number of updates): the run's budget, in place of the "
        "preset's --epoch-budgets",
    )
    epoch_budgets: tuple[int, ...] | None = option(
        None,
        "several budgets, e.g. 1,10: one run per value of --epochs (a budget curve: the score against the updates)",
    )
    seeds: tuple[int, ...] | None = option(
        None, "several seeds, e.g. 0,1,2: one run per seed, one after the other (resumable); tables show mean ± sd"
    )
    init: Init = option_of(
        T, "init", "TokMem's new rows: mean embedding (the paper's text) or orthogonal (the reference code)"
    )
    schedule: Schedule = option_of(
        T,
        "schedule",
        "learning rate of every trained method: constant, or linear (10% warm-up, then decay; the reference code)",
        flag="--lr-schedule",
    )
    warmup: float = option_of(T, "warmup")
    renorm_every_step: bool = option_of(
        T,
        "renorm_every_step",
        "renormalise TokMem's new rows after every step too (the reference code), not only after the round",
    )
    renorm_target: RenormTarget = option_of(
        T,
        "renorm_target",
        "TokMem's new rows renormalised to the old rows' mean norm (none in a first round) or a token's",
    )
    renorm_side: RenormSide = option_of(
        T, "renorm_side", "the matrix of a decoupled bank renormalised: index (routing; the paper's) or steer (input)"
    )
    tool_segments: ToolSegments = option_of(T, "tool_segments")
    key_order: KeyOrder = option_of(
        T, "key_order", "the order TokMem's tool arguments are trained and decoded in: the calls' or the schema's"
    )
    segment_backprop: bool = option_of(
        T,
        "segment_backprop",
        "tool loops: TokMem back-propagates each call (memory token, arguments) on its own, the results read without "
        "gradients (an approximation)",
    )
    choice_weight: float = option_of(
        T, "choice_weight", "loss weight of the argument tokens where a call decides its keys (every trained method)"
    )
    route_weight: float = option_of(T, "route_weight", "loss weight of TokMem's memory-token labels (the routing)")
    refit_index: bool = option_of(
        T, "refit_index", "TokMem's new rows' routing side refit on their training states after each round (decoupled)"
    )
    key_sets: bool = option_of(
        T, "key_sets", "TokMem's new tools get a row per training key set, chosen where the tool is routed"
    )
    negatives: float = option_of(
        T, "negatives", "off-topic queries TokMem trains per example, each to leave the query to the backbone"
    )
    batch_size: int = option_of(T, "batch_size", "training examples per step")
    max_length: int = option_of(T, "max_length")
    max_new_tokens: int = option_of(D, "max_new_tokens")
    eval_batch_size: int = option_of(D, "batch_size")
    tokmem_lr: float = option_of(T, "lr")
    lora_lr: float = option_of(L, "lr", "learning rate of fine-tuning and replay")
    lora_weight_decay: float = option_of(L, "weight_decay", "weight decay of fine-tuning and replay")
    lora_rank: int | None = option_of(L, "rank", "LoRA rank of fine-tuning and replay")
    replay_ratio: float = option(R.ratio, "share of replayed examples in a batch")
    seed: int = option_of(T, "seed", "seed of the data and training")
    backbone: str = backbone_option()
    device: str | None = device_option()
    preset: str | None = None

    def epochs_of(self, method: str) -> int:
        """How many passes a method (by name) makes over a round's examples: 0 for those that train nothing."""
        return self.epochs if method.startswith("tokmem") or method in ("lora", "replay") else 0

    def repeated(self) -> bool:
        """Whether the study runs more than once: several seeds or budgets (`research.studies.harness.run_repeats`)."""
        return self.seeds is not None or self.epoch_budgets is not None

    def decode(self) -> DecodeConfig:
        """How every method answers (TokMem: one memory-token segment an answer, atomic recall)."""
        return config_from(self, DecodeConfig, max_steps=1)

    def train(self) -> TrainConfig:
        """How every trained method trains; its lr is TokMem's rows' (fine-tuning's is in ``lora``)."""
        return config_from(self, TrainConfig)

    def lora(self) -> LoRASettings:
        """The adapters of fine-tuning, replay and TokMem with an unfrozen backbone."""
        return config_from(self, LoRASettings)
