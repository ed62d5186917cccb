"""The settings the atomic and compositional studies share: how their methods train and answer.

Each study's config inherits them and adds its data, its methods and the defaults of its own.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from tokmem.train import INITS, SCHEDULES, TOOL_SEGMENTS

RECIPE_OPTIONS = {  # MethodSettings field → argparse keywords; every one overrides the preset's value
    "tokmem_epochs": dict(type=int, help="epochs of TokMem's rows (default: --epochs)"),
    "lora_epochs": dict(type=int, help="epochs of fine-tuning and replay (default: --epochs)"),
    "init": dict(choices=INITS, help="TokMem's new rows: mean embedding (the paper's text) or orthogonal (the reference code)"),
    "schedule": dict(flag="--lr-schedule", choices=SCHEDULES,
                     help="learning rate: constant, or linear (10%% warm-up, then decay; the reference code)"),
    "warmup": dict(type=float, help="warm-up fraction of the linear schedule (default 0.1)"),
    "renorm_every_step": dict(action=argparse.BooleanOptionalAction,
                              help="renormalise TokMem's new rows after every step too (the reference code)"),
    "tool_segments": dict(choices=TOOL_SEGMENTS, help="after a tool's memory token: its arguments only (the reference "
                          "code) or the whole call"),
}


def add_recipe_arguments(parser: argparse.ArgumentParser) -> None:
    """The training-recipe options every study takes (``--init``, ``--lr-schedule``, …); default None = the preset's."""
    for name, keywords in RECIPE_OPTIONS.items():
        keywords = dict(keywords)
        flag = keywords.pop("flag", f"--{name.replace('_', '-')}")
        parser.add_argument(flag, dest=name, default=None, **keywords)


@dataclass(frozen=True)
class MethodSettings:
    epochs: int = 1
    tokmem_epochs: int | None = None  # TokMem's rows; default ``epochs``
    lora_epochs: int | None = None  # fine-tuning and replay; default ``epochs``
    init: str = "mean"  # TokMem's new rows: "mean" (the paper's text) or "orthogonal" (the reference code)
    schedule: str = "constant"  # every trained method: "constant" or "linear" (warm-up, then linear decay)
    warmup: float = 0.1
    renorm_every_step: bool = False  # TokMem: renormalise new rows after every step (the reference code), not only after the round
    tool_segments: str = "arguments"  # TokMem: after a tool's memory token its "arguments" only (reference code), or the whole "call"
    batch_size: int = 4
    max_length: int = 1024
    max_new_tokens: int = 128
    eval_batch_size: int = 16
    tokmem_lr: float = 5e-3
    lora_lr: float = 5e-5
    lora_weight_decay: float = 0.01
    lora_rank: int | None = 8
    seed: int = 0
    device: str | None = None
    preset: str | None = None

    def epochs_of(self, method: str) -> int:
        """How many passes a method (by name) makes over a round's examples: 0 for those that train nothing."""
        if method.startswith("tokmem"):
            return self.tokmem_epochs or self.epochs
        return self.lora_epochs or self.epochs if method in ("lora", "replay") else 0

    def decode_options(self) -> dict:
        """Keyword arguments of every method: how it answers."""
        return dict(max_new_tokens=self.max_new_tokens, eval_batch_size=self.eval_batch_size)

    def train_options(self) -> dict:
        """Keyword arguments of every trained method."""
        return dict(epochs=self.epochs, batch_size=self.batch_size, max_length=self.max_length, seed=self.seed,
                    schedule=self.schedule, warmup=self.warmup, **self.decode_options())

    def tokmem_options(self) -> dict:
        """Keyword arguments of TokMem's variants."""
        return self.train_options() | dict(lr=self.tokmem_lr, epochs=self.tokmem_epochs or self.epochs, init=self.init,
                                           renorm_every_step=self.renorm_every_step, tool_segments=self.tool_segments)

    def lora_options(self) -> dict:
        """Keyword arguments of fine-tuning and replay."""
        return self.train_options() | dict(rank=self.lora_rank, lr=self.lora_lr, weight_decay=self.lora_weight_decay,
                                           epochs=self.lora_epochs or self.epochs)
