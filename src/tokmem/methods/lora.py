"""Fine-tuning baselines: LoRA on the attention's query and value projections, and LoRA with replay.

The training sequence is TokMem's without the memory token (``chat(query) response EOS``, loss on
the response and EOS only), batched and masked by the same ``sequences.encode`` / ``collate`` and scored
by the same ``TokMemModel.loss`` (on an empty bank).  Rounds are sequential: each ``learn`` call
trains on its examples with a fresh AdamW, carrying the adapter weights over from the last round.

The backbone object is shared with every other method of a study, so the adapters are injected
into it (PEFT ``LoraModel``) only for the duration of a round or an answer and taken out again
(``unload``, no merge) afterwards; between uses they live in ``weights``.  The backbone's own
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
from contextlib import contextmanager
from pathlib import Path

import torch
from peft import LoraConfig, LoraModel
from safetensors.torch import load_file, save_file

import tokmem
from tokmem.backbones import Backbone
from tokmem.methods.method import Answer, Method, plain_answers
from tokmem.data.procedures import Example, Step
from tokmem.sequences import collate, encode
from tokmem.train import lr_scheduler

ADAPTER = "default"


class LoRA(Method):
    name = "lora"
    label = "Fine-tuning"

    def __init__(
        self, backbone: Backbone, rank: int = 8, lr: float = 5e-5, weight_decay: float = 0.01, epochs: int = 1,
        batch_size: int = 4, max_length: int = 1024, max_new_tokens: int = 128, eval_batch_size: int = 16,
        seed: int = 0, target_modules: tuple[str, ...] = ("q_proj", "v_proj"), schedule: str = "constant", warmup: float = 0.1,
    ):
        self.backbone = backbone
        self.model = tokmem.create(backbone)  # an empty bank: TokMem's loss and decoder over the plain backbone
        # alpha = 2r keeps the adapter's scale the same at every rank (r=1 and r=8 differ in capacity only)
        self.config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=list(target_modules))
        self.lr, self.weight_decay, self.epochs, self.batch_size = lr, weight_decay, epochs, batch_size
        self.schedule, self.warmup = schedule, warmup
        self.max_length, self.max_new_tokens, self.eval_batch_size, self.seed = max_length, max_new_tokens, eval_batch_size, seed
        self.rounds = 0
        self.weights: dict[str, torch.Tensor] | None = None
        torch.manual_seed(seed)
        with self.attached():  # PEFT's initialisation: A random, B zero (the adapted model starts as the backbone)
            pass

    @contextmanager
    def attached(self):
        """The backbone with this method's adapters injected, for the duration of the block."""
        tuner = LoraModel(self.backbone.model, self.config, ADAPTER)
        try:
            params = {n: p for n, p in self.backbone.model.named_parameters() if "lora_" in n}
            if self.weights is not None:
                with torch.no_grad():
                    for name, parameter in params.items():
                        parameter.copy_(self.weights[name])
            yield list(params.values())
            self.weights = {name: p.detach().cpu().clone() for name, p in params.items()}
        finally:
            tuner.unload()

    def trainable_params(self) -> int:
        return sum(w.numel() for w in self.weights.values())

    def batches(self, examples: list[Example]) -> list[list[Example]]:
        """This round's batches: ``epochs`` shuffled passes over the examples, seeded by the round."""
        rng = random.Random(f"{self.seed}:{self.rounds}")
        order = []
        for _ in range(self.epochs):
            epoch = list(examples)
            rng.shuffle(epoch)
            order += epoch
        return [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]

    def learn(self, examples: list[Example]) -> None:
        batches = self.batches(examples)
        tokenizer, device = self.backbone.tokenizer, self.backbone.device
        autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
        with self.attached() as params:
            optimizer = torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay)
            scheduler = lr_scheduler(optimizer, len(batches), self.schedule, self.warmup)
            for done, batch in enumerate(batches, 1):
                encoded = [encode(e, tokenizer, None, self.max_length) for e in batch]
                inputs = {k: v.to(device) for k, v in collate(encoded, tokenizer.pad_token_id).items()}
                with autocast:
                    loss, _ = self.model.loss(inputs)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                scheduler.step()
                self.report_step(done, len(batches))
        self.rounds += 1

    def answer(self, queries: list[str]) -> list[Answer]:
        with self.attached():
            texts = plain_answers(self.model, queries, self.max_new_tokens, self.eval_batch_size)
        return [Answer(text) for text in texts]

    def save(self, directory: Path) -> bool:
        directory.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.weights.items()}, directory / "adapter.safetensors")
        (directory / "state.json").write_text(json.dumps(self.state()), encoding="utf-8")
        return True

    def load(self, directory: Path) -> bool:
        if not (directory / "state.json").is_file():
            return False
        self.weights = load_file(directory / "adapter.safetensors")
        self.restore(json.loads((directory / "state.json").read_text(encoding="utf-8")))
        return True

    def state(self) -> dict:
        return {"rounds": self.rounds}

    def restore(self, state: dict) -> None:
        self.rounds = state["rounds"]


class Replay(LoRA):
    name = "replay"
    label = "Replay Memory"

    def __init__(self, backbone: Backbone, ratio: float = 0.2, buffer_size: int = 500, refresh_every: int = 10, **lora_options):
        super().__init__(backbone, **lora_options)
        self.ratio, self.buffer_size, self.refresh_every = ratio, buffer_size, refresh_every
        self.buffer: list[Example] = []  # what batches replay from
        self.reservoir: list[Example] = []  # a uniform sample of every training example seen so far
        self.seen = 0  # training examples seen
        self.procedures = 0  # procedures learned

    def batches(self, examples: list[Example]) -> list[list[Example]]:
        rng = random.Random(f"replay:{self.seed}:{self.rounds}")
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
        rng = random.Random(f"reservoir:{self.seed}:{self.rounds}")
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
            **super().state(), "seen": self.seen, "procedures": self.procedures,
            "buffer": [e.to_json() for e in self.buffer], "reservoir": [e.to_json() for e in self.reservoir],
        }

    def restore(self, state: dict) -> None:
        super().restore(state)
        self.seen, self.procedures = state["seen"], state["procedures"]
        self.buffer = [_example(obj) for obj in state["buffer"]]
        self.reservoir = [_example(obj) for obj in state["reservoir"]]


def _example(obj: dict) -> Example:
    return Example(obj["query"], tuple(Step(**step) for step in obj["steps"]), obj.get("id"))
