"""The memorisation study's config: every setting of a run and the presets (`research.studies.memorization` runs
them)."""

from __future__ import annotations

from dataclasses import dataclass

from tokmem.backbones import backbone_option, device_option
from tokmem.config import option, option_of
from tokmem.data.shared import shared_data
from research.studies.settings import Layer, preset_settings
from tokmem.training.train import TrainConfig


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
    seeds: tuple[int, ...] = option((0, 1, 2, 3, 4), "memorization: seeds to average over, one run each, e.g. 0,1,2")
    lr: float = option_of(TrainConfig, "lr")
    batch_size: int = option(8, "sequences per forward pass (memorization: one optimiser step covers the whole text)")
    device: str | None = device_option()
    progress: bool = True


PRESETS = {
    "paper": (),
    # smollm2-135m on a CPU: 24 runs of 60 steps
    "cpu": (Layer(dict(text_tokens=(128, 256), steps=60, eval_every=10, seeds=(0, 1), lr=2e-2)),),
}


def make_config(preset: str | None = "cpu", **options) -> MemorizationConfig:
    """A preset's settings, overridden by every option that is not None (`settings.preset_settings`)."""
    return MemorizationConfig(**preset_settings(PRESETS, preset, MemorizationConfig, options))
