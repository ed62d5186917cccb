"""Fine-tuning baselines: LoRA on the attention's query and value projections, and LoRA with replay.

The training sequence is TokMem's without the memory token (``chat(query) response EOS``, loss on
the response and EOS only), batched and masked by the same ``sequences.encode`` / ``collate`` and scored
by the same ``TokMemModel.loss`` (on an empty bank), in the one training loop (``train.fit``, the adapter
weights as its parameter group).  Rounds are sequential: each ``learn`` call trains on its examples with a
fresh AdamW, carrying the adapter weights over from the last round.

The backbone object is shared with every other method of a study, so the adapters (`tokmem.lora.Adapter`)
are injected into it only for the duration of a round or an answer and taken out again (no merge)
afterwards; between uses they live in ``adapter.weights``.  The backbone's own
weights never get ``requires_grad`` and stay bit-identical.

Replay keeps a uniform sample (reservoir) of every training example seen so far; every
``refresh_every`` procedures it becomes the replay buffer, and each training batch of ``batch_size``
new examples gets ``ratio / (1 - ratio)`` as many buffer examples added, so that replayed examples
are ``ratio`` of the batch (4 new + 1 replayed = 20%).  The buffer is empty until the first
refresh: the first ``refresh_every`` procedures train exactly as plain fine-tuning does.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from itertools import accumulate
from pathlib import Path

import tokmem
from tokmem.decoding.decode import DecodeConfig
from tokmem.backbones import Backbone
from tokmem.data.procedures import Example, Step
from tokmem.training.lora import Adapter, LoRASettings
from research.methods.method import Answer, Method, plain_answers
from tokmem.training.sequences import encode
from tokmem.training.train import TrainConfig, epoch_order, fit

STATE_FILE = "state.json"


class LoRA(Method):
    name = "lora"
    label = "Fine-tuning"

    def __init__(
        self,
        backbone: Backbone,
        train: TrainConfig | None = None,
        lora: LoRASettings | None = None,
        decode: DecodeConfig | None = None,
        name: str | None = None,
        label: str | None = None,
    ):
        """``train``: the epochs, batches and schedule (its lr is the memory rows': LoRA's is ``lora.lr``); ``name``
        and ``label``: a study's row of another kind (on TokMem's adapted backbone)."""
        self.name, self.label = name or self.name, label or self.label
        self.backbone = backbone
        self.model = tokmem.create(backbone)  # an empty bank: TokMem's loss and decoder over the plain backbone
        self.train_config = replace(train or TrainConfig(), progress=False)
        self.lora = lora or LoRASettings()
        self.decode_config = decode or DecodeConfig()
        self.adapter = Adapter(backbone.model, self.lora, self.train_config.seed)
        self.epochs = self.train_config.epochs
        self.rounds = 0

    def attached(self):
        """The shared backbone with this method's adapters injected, for the duration of the block."""
        return self.adapter.attached()

    def trainable_params(self) -> int:
        return self.adapter.parameter_count()

    def batches(self, examples: list[Example]) -> list[list[Example]]:
        """This round's batches: ``epochs`` shuffled passes over the examples, seeded by the round."""
        size = self.train_config.batch_size
        order = epoch_order(len(examples), self.epochs, f"{self.train_config.seed}:{self.rounds}")
        return [[examples[i] for i in order[first : first + size]] for first in range(0, len(order), size)]

    def learn(self, examples: list[Example]) -> None:
        batches = self.batches(examples)
        pool = [e for batch in batches for e in batch]
        bounds = [0, *accumulate(map(len, batches))]
        steps = [list(range(first, end)) for first, end in zip(bounds, bounds[1:])]
        encoded = [encode(e, self.backbone.tokenizer, None, self.train_config.max_length) for e in pool]
        with self.attached() as params:
            fit(
                self.model,
                encoded,
                self.train_config,
                on_step=self.counting_steps(),
                param_groups=[self.lora.param_group(params)],
                steps=steps,
            )
        self.rounds += 1

    def answer(self, queries: list[str]) -> list[Answer]:
        with self.attached():
            texts = plain_answers(self.model, queries, self.decode_config)
        return [Answer(text) for text in texts]

    def continue_contexts(self, contexts: list[list[int]], call_due: bool = False) -> list[str]:
        with self.attached():
            return super().continue_contexts(contexts, call_due)

    def save(self, directory: Path) -> bool:
        self.adapter.save(directory)
        (directory / STATE_FILE).write_text(json.dumps(self.state()), encoding="utf-8")
        return True

    def load(self, directory: Path) -> bool:
        if not (directory / STATE_FILE).is_file() or not self.adapter.load(directory):
            return False
        self.restore(json.loads((directory / STATE_FILE).read_text(encoding="utf-8")))
        return True

    def state(self) -> dict:
        return {"rounds": self.rounds, "updates": self.updates}

    def restore(self, state: dict) -> None:
        self.rounds, self.updates = state["rounds"], state.get("updates", 0)


@dataclass(frozen=True)
class ReplaySettings:
    ratio: float = 0.2  # share of replayed examples in a batch
    buffer_size: int = 500  # examples the buffer keeps
    refresh_every: int = 10  # procedures between refreshes of the buffer


class Replay(LoRA):
    name = "replay"
    label = "Replay Memory"

    def __init__(self, backbone: Backbone, replay: ReplaySettings | None = None, **lora_options):
        """``replay``: the buffer's share of a batch, size and refreshes; ``lora_options``: fine-tuning's."""
        super().__init__(backbone, **lora_options)
        replay = replay or ReplaySettings()
        self.ratio, self.buffer_size, self.refresh_every = replay.ratio, replay.buffer_size, replay.refresh_every
        self.buffer: list[Example] = []  # what batches replay from
        self.reservoir: list[Example] = []  # a uniform sample of every training example seen so far
        self.seen = 0  # training examples seen
        self.procedures = 0  # procedures learned

    def batches(self, examples: list[Example]) -> list[list[Example]]:
        rng = random.Random(f"replay:{self.train_config.seed}:{self.rounds}")
        out = []
        for batch in super().batches(examples):
            extra = min(round(len(batch) * self.ratio / (1 - self.ratio)), len(self.buffer))
            out.append(batch + rng.sample(self.buffer, extra))
        return out

    def learn(self, examples: list[Example]) -> None:
        super().learn(examples)
        self.remember(examples)

    def remember(self, examples: list[Example]) -> None:
        """Add the round's examples to the reservoir; refresh the buffer when a multiple of ``refresh_every`` is passed."""
        rng = random.Random(f"reservoir:{self.train_config.seed}:{self.rounds}")
        for example in examples:
            if len(self.reservoir) < self.buffer_size:
                self.reservoir.append(example)
            else:
                slot = rng.randrange(self.seen + 1)
                if slot < self.buffer_size:
                    self.reservoir[slot] = example
            self.seen += 1
        before = self.procedures
        self.procedures += len({p for e in examples for p in e.procedures})
        if self.procedures // self.refresh_every > before // self.refresh_every:
            self.buffer = list(self.reservoir)

    def state(self) -> dict:
        return {
            **super().state(),
            "seen": self.seen,
            "procedures": self.procedures,
            "buffer": [e.to_json() for e in self.buffer],
            "reservoir": [e.to_json() for e in self.reservoir],
        }

    def restore(self, state: dict) -> None:
        super().restore(state)
        self.seen, self.procedures = state["seen"], state["procedures"]
        self.buffer = [_example(obj) for obj in state["buffer"]]
        self.reservoir = [_example(obj) for obj in state["reservoir"]]


def _example(obj: dict) -> Example:
    return Example(obj["query"], tuple(Step(**step) for step in obj["steps"]), obj.get("id"))
