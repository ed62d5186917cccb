"""The settings the atomic and compositional studies share: how their methods train and answer; and the one shape of
every study's presets.

Each study's config inherits them and adds its data, its methods and the defaults of its own; the defaults
here are those of `TrainConfig`, `DecodeConfig` and `LoRASettings`, and the settings build those objects
(``train``, ``decode``, ``lora``) for the methods.  Every trained method of a run trains the same number of epochs
(``epochs``): methods are compared at equal budgets by construction.

A preset is data: a tuple of `Layer`s, each some settings and the choices it applies under (the study, the dataset,
the backbone: ``--preset cpu --backbone qwen2.5-coder-0.5b`` picks the layers sized for that backbone); the layers that
apply are merged in order, then every option given overrides them (``preset_settings``).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields

from tokmem.backbones import backbone_option, device_option
from tokmem.config import option
from tokmem.decode import DecodeConfig
from tokmem.errors import TokMemError
from tokmem.lora import LoRASettings
from tokmem.methods.lora import ReplaySettings
from tokmem.train import Init, Schedule, ToolSegments, TrainConfig

T, D, L, R = TrainConfig, DecodeConfig, LoRASettings, ReplaySettings  # every default below is theirs


@dataclass(frozen=True)
class Layer:
    """Settings of a preset, and the choices they apply under (``{}``: always; ``{"study": "main"}``,
    ``{"dataset": "complexfuncbench", "backbone": "qwen2.5-coder-0.5b"}``: when every one of them is chosen)."""

    settings: dict
    when: dict = field(default_factory=dict)


Preset = tuple[Layer, ...]


def preset_settings(presets: dict[str, Preset], name: str | None, config: type, options: dict) -> dict:
    """The settings of preset ``name`` (None: none) for the choices made: each layer applies when its ``when`` matches
    the options given, else the settings so far, else ``config``'s defaults; then every option given overrides them
    (``overridden``)."""
    if name is not None and name not in presets:
        raise TokMemError(f"unknown preset '{name}': choose from {', '.join(presets)}")
    given = {key: value for key, value in options.items() if value is not None}
    settings = {}
    for layer in presets.get(name, ()):
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
    epochs: int = option(
        T.epochs,
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
    init: Init = option(
        T.init, "TokMem's new rows: mean embedding (the paper's text) or orthogonal (the reference code)"
    )
    schedule: Schedule = option(
        T.schedule,
        "learning rate of every trained method: constant, or linear (10% warm-up, then decay; the reference code)",
        flag="--lr-schedule",
    )
    warmup: float = option(T.warmup, "warm-up fraction of the linear schedule")
    renorm_every_step: bool = option(
        T.renorm_every_step,
        "renormalise TokMem's new rows after every step too (the reference code), not only after the round",
    )
    tool_segments: ToolSegments = option(
        T.tool_segments, "after a tool's memory token: its arguments only (the reference code) or the whole call"
    )
    batch_size: int = option(T.batch_size, "training examples per step")
    max_length: int = option(T.max_length, "longest training sequence in tokens (longer queries are cut from the left)")
    max_new_tokens: int = option(D.max_new_tokens, "tokens an answer may generate")
    eval_batch_size: int = option(D.batch_size, "queries answered together")
    tokmem_lr: float = option(T.lr, "learning rate of the memory rows")
    lora_lr: float = option(L.lr, "learning rate of fine-tuning and replay")
    lora_weight_decay: float = option(L.weight_decay, "weight decay of fine-tuning and replay")
    lora_rank: int | None = option(L.rank, "LoRA rank of fine-tuning and replay")
    replay_ratio: float = option(R.ratio, "share of replayed examples in a batch")
    seed: int = option(T.seed, "seed of the data and training")
    backbone: str = backbone_option()
    device: str | None = device_option()
    preset: str | None = None

    def epochs_of(self, method: str) -> int:
        """How many passes a method (by name) makes over a round's examples: 0 for those that train nothing."""
        return self.epochs if method.startswith("tokmem") or method in ("lora", "replay") else 0

    def repeated(self) -> bool:
        """Whether the study runs more than once: several seeds or budgets (`tokmem.studies.harness.run_repeats`)."""
        return self.seeds is not None or self.epoch_budgets is not None

    def decode(self) -> DecodeConfig:
        """How every method answers (TokMem: one memory-token segment an answer, atomic recall)."""
        return DecodeConfig(max_new_tokens=self.max_new_tokens, batch_size=self.eval_batch_size, max_steps=1)

    def train(self) -> TrainConfig:
        """How every trained method trains; its lr is TokMem's rows' (fine-tuning's is in ``lora``)."""
        return TrainConfig(
            lr=self.tokmem_lr,
            epochs=self.epochs,
            batch_size=self.batch_size,
            max_length=self.max_length,
            seed=self.seed,
            init=self.init,
            schedule=self.schedule,
            warmup=self.warmup,
            renorm_every_step=self.renorm_every_step,
            tool_segments=self.tool_segments,
        )

    def lora(self) -> LoRASettings:
        """The adapters of fine-tuning, replay and TokMem with an unfrozen backbone."""
        return LoRASettings(rank=self.lora_rank, lr=self.lora_lr, weight_decay=self.lora_weight_decay)
