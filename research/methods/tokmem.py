"""TokMem (and TokMem+DC) behind the study interface: one continual round per ``learn`` call.

Every test query of a study belongs to a stored procedure, so answers always route (the open-set
threshold is 0).  By default an answer stops after one segment (atomic recall); a ``DecodeConfig`` with
``max_steps`` > 1 lets it chain memory tokens (compositional use: one tool call per segment).

``UnfrozenTokMem`` is the ablation that lets the backbone change while new memories are learned.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

import tokmem
from tokmem.backbones import Backbone
from tokmem.bank.memory_bank import MEMORY_TOKENS, SHARED_TOKENS, MemoryBank
from tokmem.io import read_json, write_json_atomic
from research.methods.method import Answer, Method
from tokmem.data.procedures import Example
from tokmem.decoding.decode import DecodeConfig, generate
from tokmem.training.lora import Adapter, LoRASettings
from tokmem.model import TokMemModel
from tokmem.training.train import TrainConfig

BANK_FILE = "bank.safetensors"
STATE_FILE = "state.json"  # the updates made so far
ADAPTER_DIR = "adapter"


class TokMem(Method):
    choice_metric = "routing_accuracy"

    def __init__(
        self,
        backbone: Backbone,
        train: TrainConfig | None = None,
        decode: DecodeConfig | None = None,
        decoupled: bool = False,
        name: str | None = None,
        label: str | None = None,
        schemas: dict[str, dict] | None = None,
        shows_schemas: bool = False,
        memory_tokens: int = MEMORY_TOKENS,
        shared_tokens: int = SHARED_TOKENS,
    ):
        """``decode``: how it answers (default: one segment an answer, atomic recall; every query routes: the
        open-set threshold is set to 0).  ``schemas``: tool name → its arguments' JSON schema, kept with the tool's
        row (``decode.schema``: decode the arguments under it); ``shows_schemas``: a bank that also shows it between
        the memory token and the arguments (``tokmem+schema``, answered through ``tokmem.chat``); ``memory_tokens``: a
        tool's memory tokens; ``shared_tokens``: the rows every tool reads after its own (``MemoryBank``)."""
        self.name, self.label = ("tokmem-dc", "TokMem+DC") if decoupled else ("tokmem", "TokMem")
        self.name, self.label = name or self.name, label or self.label
        self.model = tokmem.create(backbone, decoupled, shows_schemas, memory_tokens, shared_tokens)
        self.train_config = replace(train or TrainConfig(), progress=False)
        self.epochs = self.train_config.epochs
        self.decode_config = replace(decode or DecodeConfig(max_steps=1), threshold=0.0)
        self.schemas = schemas

    @classmethod
    def trained(cls, model: TokMemModel, decode_config: DecodeConfig) -> TokMem:
        """A model trained elsewhere (a bank file) behind the method interface, answering with ``decode_config``, so
        that a study scores it as its own TokMem (``tests/test_evaluate.py``: ``tokmem eval`` scores the tool loop
        as the study does)."""
        method = cls(model.backbone, decoupled=model.bank.decoupled)
        method.model, method.decode_config = model, decode_config
        return method

    def trainable_params(self) -> int:
        """Every memory row (each trained in its own round, then frozen)."""
        return self.model.bank.parameter_count()

    def learn(self, examples: list[Example]) -> None:
        report = tokmem.learn(
            self.model, examples, self.train_config, on_step=self.counting_steps(), schemas=self.schemas
        )
        truncated = asdict(report.truncated) if report.truncated else None  # a study must not cut sequences unseen
        resumed = (
            {"from_step": report.resumed_from, "seconds": round(report.seconds, 1)} if report.resumed_from else None
        )
        self.learn_report = {
            key: value
            for key, value in (
                ("refit", report.refit),
                ("key_sets", report.key_sets),
                ("truncated", truncated),
                ("resumed", resumed),
            )
            if value
        } or None

    def answer(self, queries: list[str]) -> list[Answer]:
        generations = generate(self.model, queries, self.decode_config)
        return [Answer(g.text, g.procedures[0] if g.procedures else None, g.trace) for g in generations]

    def save(self, directory: Path) -> bool:
        self.model.bank.save(directory / BANK_FILE)
        write_json_atomic(directory / STATE_FILE, {"updates": self.updates})
        return True

    def load(self, directory: Path) -> bool:
        path = directory / BANK_FILE
        if not path.is_file():
            return False
        backbone = self.model.backbone
        self.model = TokMemModel(backbone, MemoryBank.load(path, backbone=backbone))
        state = directory / STATE_FILE
        self.updates = read_json(state)["updates"] if state.is_file() else 0
        return True


class UnfrozenTokMem(TokMem):
    """TokMem whose backbone is not frozen: every round trains LoRA adapters on the backbone jointly with
    the new memory rows, and the adapters carry over, unmerged, to the next round.

    Old rows stay frozen as in TokMem, but the network that reads them moves: the paper's ablation of
    freezing the backbone.  The adapters are a `tokmem.lora.Adapter`, injected only while learning or
    answering, so the shared backbone object itself is never changed.
    """

    def __init__(self, backbone: Backbone, lora: LoRASettings | None = None, **options):
        """``lora``: the adapters' rank, lr and weight decay; ``options``: TokMem's."""
        options = {"name": "tokmem-unfrozen", "label": "TokMem (unfrozen backbone)", **options}
        super().__init__(backbone, **options)
        self.lora = lora or LoRASettings()
        self.adapter = Adapter(backbone.model, self.lora, seed=self.train_config.seed)

    def trainable_params(self) -> int:
        return super().trainable_params() + self.adapter.parameter_count()

    def learn(self, examples: list[Example]) -> None:
        with self.adapter.attached() as params:
            tokmem.learn(
                self.model,
                examples,
                self.train_config,
                param_groups=[self.lora.param_group(params)],
                on_step=self.counting_steps(),
            )

    def answer(self, queries: list[str]) -> list[Answer]:
        with self.adapter.attached():
            return super().answer(queries)

    def save(self, directory: Path) -> bool:
        self.adapter.save(directory / ADAPTER_DIR)
        return super().save(directory)

    def load(self, directory: Path) -> bool:
        return super().load(directory) and self.adapter.load(directory / ADAPTER_DIR)
