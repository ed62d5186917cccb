"""The GSM8K placement study's config: how each layout frames a problem, every setting of a run and the presets
(`research.studies.gsm8k_placement` runs them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tokmem.backbones import backbone_option, device_option
from tokmem.config import config_from, option, option_of
from tokmem.data.shared import shared_data
from tokmem.decoding.decode import DecodeConfig
from research.studies.settings import Layer, preset_settings
from tokmem.training.train import TrainConfig

# How each layout frames a problem: the user turn's text and the target's text.
FRAMES = {"reference": ("question: {}", "answer: {}"), "assistant": ("{}", "{}")}
LAYOUTS = tuple(FRAMES)
Layout = Literal[LAYOUTS]


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
    epochs: int = option_of(TrainConfig, "epochs", "gsm8k: training epochs (validation after each)", default=3)
    lr: float = option_of(TrainConfig, "lr")
    batch_size: int = option_of(TrainConfig, "batch_size", "training examples per step")
    max_new_tokens: int = option_of(DecodeConfig, "max_new_tokens", "tokens an answer may generate", default=512)
    decode_batch_size: int = option_of(DecodeConfig, "batch_size", "problems answered together")
    seed: int = option_of(TrainConfig, "seed", "seed of the data order and the rows")
    device: str | None = device_option()
    progress: bool = True

    def train(self) -> TrainConfig:
        """How the rows train."""
        return config_from(self, TrainConfig, progress=self.progress)

    def decode(self) -> DecodeConfig:
        """How the answers decode (greedy)."""
        return config_from(self, DecodeConfig, seed=self.seed)


PRESETS = {
    "paper": (),
    # smollm2-135m on a CPU: 240 training problems
    "cpu": (Layer(dict(train_examples=240, validation_examples=32, test_examples=64, max_new_tokens=256)),),
}


def make_config(preset: str | None = "cpu", **options) -> GSM8KConfig:
    """A preset's settings, overridden by every option that is not None (`settings.preset_settings`)."""
    return GSM8KConfig(**preset_settings(PRESETS, preset, GSM8KConfig, options))
