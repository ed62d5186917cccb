"""What an interrupted training needs to go on where it stopped (``TrainConfig.resume``).

Every ``checkpoint_every`` optimiser steps ``fit`` saves the bank to ``TrainConfig.checkpoint`` and, beside it
(``<checkpoint>.train-state.pt``), the trained tensors' values, the optimiser's moments, the schedule's position,
the RNG and the report so far.  A run started again with ``resume`` loads them and takes the remaining steps: the
step order comes from the seed, so it ends where an uninterrupted run would.  A fingerprint of the settings, the
sequences and the trained tensors' shapes refuses a state saved by another training.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from tokmem.training import distributed
from tokmem.bank.file_format import metadata_path
from tokmem.errors import TokMemError
from tokmem.io import atomic_write

SUFFIX = ".train-state.pt"
FORMAT = 1
RUN_ONLY = ("progress", "checkpoint", "checkpoint_every", "resume", "prefix_cache_gib")  # not what is learned
REPORT_FIELDS = ("steps", "examples", "tokens", "positions", "target_tokens", "seconds", "losses")


def state_path(checkpoint) -> Path:
    """Where the training state of the checkpoint bank ``checkpoint`` is kept."""
    return Path(f"{checkpoint}{SUFFIX}")


def remove(checkpoint) -> None:
    """Drop the training state beside ``checkpoint`` (once the trained bank is saved: nothing left to resume)."""
    state_path(checkpoint).unlink(missing_ok=True)


def remove_checkpoint(checkpoint) -> None:
    """Drop a checkpoint whose bank is not the result (its two files) and its training state: once the training it
    checkpointed has ended, kept elsewhere (an adaptation's merged backbone, a study's kept bank)."""
    for path in (Path(checkpoint), metadata_path(checkpoint)):
        path.unlink(missing_ok=True)
    remove(checkpoint)


@dataclass
class TrainingState:
    """The state ``fit`` saves and resumes: its optimiser (whose param groups hold every trained tensor), its
    schedule, and the fingerprint of the training they belong to."""

    path: Path
    fingerprint: str
    optimizer: torch.optim.Optimizer
    scheduler: object

    @classmethod
    def of(cls, config, steps: list[list[int]], encoded, optimizer, scheduler) -> TrainingState:
        params = trained_tensors(optimizer)
        return cls(state_path(config.checkpoint), fingerprint(config, steps, encoded, params), optimizer, scheduler)

    @property
    def params(self) -> list[torch.Tensor]:
        return trained_tensors(self.optimizer)

    def save(self, report) -> None:
        """Write the state after ``report.steps`` steps (by the main process; atomically)."""
        if not distributed.is_main():
            return
        state = {
            "format": FORMAT,
            "fingerprint": self.fingerprint,
            "params": [p.detach().cpu() for p in self.params],
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": torch.get_rng_state(),
            "report": {name: getattr(report, name) for name in REPORT_FIELDS},
        }
        atomic_write(self.path, lambda tmp: torch.save(state, tmp))

    def restore(self, report) -> int:
        """Load the saved state, if there is one, into the trained tensors, the optimiser, the schedule and
        ``report``; returns the steps it had taken (0: none saved, start from the beginning)."""
        if not self.path.is_file():
            return 0
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception as error:  # a truncated or foreign file
            raise TokMemError(f"{self.path}: not a training state tokmem can read ({error})") from None
        if state.get("format") != FORMAT or state.get("fingerprint") != self.fingerprint:
            raise TokMemError(
                f"{self.path} was saved by another training (its settings, data or rows differ): delete it to "
                "start again, or resume with the settings and data it was saved with"
            )
        with torch.no_grad():
            for param, saved in zip(self.params, state["params"], strict=True):
                param.copy_(saved)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"])
        for name, value in state["report"].items():
            setattr(report, name, value)
        return report.steps


def trained_tensors(optimizer) -> list[torch.Tensor]:
    """Every tensor ``optimizer`` trains, group by group."""
    return [p for group in optimizer.param_groups for p in group["params"]]


def fingerprint(config, steps: list[list[int]], encoded, params: list[torch.Tensor]) -> str:
    """What makes a training's result: its settings (not those of the run: progress, checkpoints), its optimiser
    steps' examples, the sequences and the trained tensors' shapes."""
    settings = {k: v for k, v in asdict(config).items() if k not in RUN_ONLY}
    shapes = [list(p.shape) for p in params]
    digest = hashlib.sha256(json.dumps([settings, steps, shapes], sort_keys=True, default=str).encode())
    for sequence in encoded:
        digest.update(json.dumps([sequence.input_ids, sequence.labels]).encode())
    return digest.hexdigest()
