"""TokMem (and TokMem+DC) behind the study interface: one continual round per ``learn`` call.

Every test query of a study belongs to a stored procedure, so answers always route (the open-set
threshold is 0) and stop after one segment (atomic recall: no chaining).
"""

from __future__ import annotations

from pathlib import Path

import tokmem
from tokmem.backbones import Backbone
from tokmem.bank import MemoryBank
from tokmem.baselines.common import Answer, Method
from tokmem.data.procedures import Example
from tokmem.decode import DecodeConfig, generate
from tokmem.model import TokMemModel
from tokmem.train import TrainConfig

BANK_FILE = "bank.safetensors"


class TokMem(Method):
    choice_metric = "routing_accuracy"

    def __init__(
        self, backbone: Backbone, decoupled: bool = False, lr: float = 5e-3, epochs: int = 1, batch_size: int = 4,
        max_length: int = 1024, max_new_tokens: int = 128, eval_batch_size: int = 16, seed: int = 0,
    ):
        self.name, self.label = ("tokmem-dc", "TokMem+DC") if decoupled else ("tokmem", "TokMem")
        self.model = tokmem.create(backbone, decoupled=decoupled)
        self.train_config = TrainConfig(lr=lr, epochs=epochs, batch_size=batch_size, max_length=max_length, seed=seed, progress=False)
        self.decode_config = DecodeConfig(max_new_tokens=max_new_tokens, max_steps=1, threshold=0.0, batch_size=eval_batch_size)

    def trainable_params(self) -> int:
        """Every memory row (each trained in its own round, then frozen)."""
        return self.model.bank.parameter_count()

    def learn(self, examples: list[Example]) -> None:
        tokmem.learn(self.model, examples, self.train_config)

    def answer(self, queries: list[str]) -> list[Answer]:
        generations = generate(self.model, queries, self.decode_config)
        return [Answer(g.text, g.procedures[0] if g.procedures else None) for g in generations]

    def save(self, directory: Path) -> bool:
        self.model.bank.save(directory / BANK_FILE)
        return True

    def load(self, directory: Path) -> bool:
        path = directory / BANK_FILE
        if not path.is_file():
            return False
        backbone = self.model.backbone
        self.model = TokMemModel(backbone, MemoryBank.load(path, backbone=backbone))
        return True
