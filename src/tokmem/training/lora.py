"""The one LoRA (PEFT): inject adapters into a backbone's model, merge them into it, or take them out again.

Three users: the adaptation phase (`tokmem.training.adapt`: inject, train with temporary rows, merge), the
fine-tuning baseline and TokMem with an unfrozen backbone (`research.methods`: an `Adapter` whose
weights live outside the model and are injected only while the method learns or answers, so that the
backbone object shared by every method of a study is never changed).  The backbone's own weights
never get ``requires_grad``: only the injected ``lora_`` weights train.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file, save_file

from tokmem.config import option
from tokmem.errors import BackboneError

if TYPE_CHECKING:
    from peft import LoraConfig, LoraModel

ADAPTER = "default"
WEIGHTS_FILE = "adapter.safetensors"


@dataclass
class LoRASettings:
    """Rank 8 on the attention's query and value projections, AdamW with lr 5e-5 and weight decay 1e-2."""

    rank: int = option(8, "LoRA rank")
    alpha: int | None = option(
        None, "LoRA alpha (default: 2 × rank, which keeps the adapter's scale the same at every rank)"
    )
    dropout: float = option(0.0, "LoRA dropout")
    target_modules: tuple[str, ...] = option(("q_proj", "v_proj"), "comma-separated modules that get adapters")
    lr: float = option(5e-5, "learning rate of the LoRA weights")
    weight_decay: float = option(1e-2, "AdamW weight decay of the LoRA weights")

    def parameter_count(self, model: torch.nn.Module) -> int:
        """The adapter weights these settings add to ``model``: rank × (inputs + outputs) of each targeted linear
        layer (what ``Adapter.parameter_count`` counts once injected; counted without injecting)."""
        return sum(
            self.rank * (module.in_features + module.out_features)
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in self.target_modules
        )

    def peft_config(self) -> LoraConfig:
        from peft import LoraConfig  # imported on use: `import tokmem` needs no PEFT (the vLLM environment has none)

        alpha = 2 * self.rank if self.alpha is None else self.alpha
        return LoraConfig(
            r=self.rank,
            lora_alpha=alpha,
            lora_dropout=self.dropout,
            target_modules=list(self.target_modules),
            bias="none",
        )

    def param_group(self, params: list[torch.nn.Parameter]) -> dict:
        """The adapter's optimiser parameter group: its own lr and weight decay beside the memory rows'."""
        return {"params": params, "lr": self.lr, "weight_decay": self.weight_decay}


def inject(model: torch.nn.Module, settings: LoRASettings, name: str = "") -> LoraModel:
    """Put fresh adapters (A random, B zero: the model's output is unchanged) into ``model`` in place."""
    try:
        from peft import LoraModel

        return LoraModel(model, settings.peft_config(), ADAPTER)
    except ValueError as err:
        raise BackboneError(f"cannot put LoRA on backbone '{name}': {err}") from None


def lora_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if "lora_" in n}


class Adapter:
    """LoRA weights kept outside a shared model and injected into it only for the duration of a block."""

    def __init__(self, model: torch.nn.Module, settings: LoRASettings | None = None, seed: int = 0):
        self.model, self.settings = model, settings or LoRASettings()
        self.weights: dict[str, torch.Tensor] | None = None
        torch.manual_seed(seed)
        with self.attached():  # PEFT's initialisation becomes the starting weights
            pass

    @contextmanager
    def attached(self):
        """The model with these adapters injected; yields their parameters, keeps what they learned."""
        tuner = inject(self.model, self.settings)
        try:
            params = lora_parameters(self.model)
            if self.weights is not None:
                with torch.no_grad():
                    for name, parameter in params.items():
                        parameter.copy_(self.weights[name])
            yield list(params.values())
            self.weights = {name: p.detach().cpu().clone() for name, p in params.items()}
        finally:
            tuner.unload()

    def parameter_count(self) -> int:
        return sum(w.numel() for w in self.weights.values())

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.weights.items()}, directory / WEIGHTS_FILE)

    def load(self, directory: Path) -> bool:
        """Restore what ``save`` wrote; False when there is nothing to restore."""
        if not (directory / WEIGHTS_FILE).is_file():
            return False
        self.weights = load_file(directory / WEIGHTS_FILE)
        return True
