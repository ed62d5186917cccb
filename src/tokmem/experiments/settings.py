"""The settings the atomic and compositional studies share: how their methods train and answer.

Each study's config inherits them and adds its data, its methods and the defaults of its own.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MethodSettings:
    epochs: int = 1
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

    def decode_options(self) -> dict:
        """Keyword arguments of every method: how it answers."""
        return dict(max_new_tokens=self.max_new_tokens, eval_batch_size=self.eval_batch_size)

    def train_options(self) -> dict:
        """Keyword arguments of every trained method."""
        return dict(epochs=self.epochs, batch_size=self.batch_size, max_length=self.max_length, seed=self.seed,
                    **self.decode_options())

    def lora_options(self) -> dict:
        """Keyword arguments of fine-tuning and replay."""
        return dict(rank=self.lora_rank, lr=self.lora_lr, weight_decay=self.lora_weight_decay, **self.train_options())
