"""The adaptation phase for compositional use (the paper's Algorithm 1).

LoRA adapters on the backbone train jointly with *temporary* memory rows on held-out procedures
(e.g. the built-in adaptation tools), so that the backbone learns to read and chain memory tokens.
Then the LoRA weights are merged into the backbone, the temporary rows are discarded and every
weight is frozen again: the adapted backbone is a plain frozen model, and banks are trained on it
as on any other.

The merge leaves the embedding matrix as it was, so the adapted model's config records an
adaptation digest that ``Backbone.fingerprint`` hashes in: a bank trained on the adapted backbone
refuses the base model.  ``save_pretrained`` keeps the digest, so a saved adapted backbone
(``adapt(..., save_to=dir)`` or ``save_backbone``) reloads with ``load_backbone(dir)`` under the
same fingerprint, and ``tokmem.load(bank)`` finds it by the directory the bank records.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import shutil
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from tokmem.training import distributed
from tokmem.backbones import ADAPTATION_KEY, Backbone, cache_dir, freeze, load_backbone
from tokmem.bank.memory_bank import MEMORY_TOKENS, MemoryBank
from tokmem.config import option
from tokmem.data.procedures import Example
from tokmem.errors import BackboneError
from tokmem.training.lora import LoRASettings, inject, lora_parameters
from tokmem.model import TokMemModel
from tokmem.training.train import LOSS_WEIGHTS, TrainConfig, initial_rows, row_kinds, row_texts, train
from tokmem.training.train_state import RUN_ONLY, remove_checkpoint

log = logging.getLogger(__name__)

# A cached adaptation's checkpoints: an interruption loses little, and writing the state (the LoRA weights and their
# moments) costs little beside the steps between.
CACHE_CHECKPOINT_EVERY = 10


@dataclass
class AdaptConfig(LoRASettings):
    """The reference code's adaptation phase: `LoRASettings` (rank 8 on the query and value projections, lr 5e-5,
    weight decay 1e-2) with alpha 32 and dropout 0.1.  The temporary rows train as TokMem's rows do, with the
    TrainConfig given to ``adapt``, in the layout the bank will have (``memory_tokens`` a tool: each call's tail read
    before its arguments as the target's will be)."""

    alpha: int | None = option(32, "LoRA alpha")
    dropout: float = option(0.1, "LoRA dropout (0 is several times faster on CPU)")
    memory_tokens: int = option(
        MEMORY_TOKENS,
        "the temporary rows' memory tokens a tool: as many as the rows a call of the bank trained on the adapted "
        "backbone lays out from its memory token to its arguments (its memory tokens, then its shared rows)",
    )


def adapt(
    backbone: str | Backbone,
    examples: list[Example],
    config: AdaptConfig | None = None,
    train_config: TrainConfig | None = None,
    save_to=None,
    inplace: bool = False,
    on_step=None,
) -> Backbone:
    """The backbone adapted on ``examples`` of held-out procedures, merged and frozen.

    ``inplace=False`` adapts a copy and leaves ``backbone`` as it was (at the cost of a second copy
    in memory); ``inplace=True`` merges into ``backbone``'s own model.  ``save_to``: a new directory to
    save the adapted model and tokenizer in, which then names the returned backbone.
    ``train_config``'s ``checkpoint``, ``checkpoint_every`` and ``resume`` checkpoint the phase (the temporary rows
    and the LoRA weights, with their optimiser) as they do a training, and the checkpoint is removed once the
    adaptation is merged; ``on_step(done, total)`` is called after each optimiser step (``tokmem.training.train``'s).
    """
    config = config or AdaptConfig()
    train_config = train_config or TrainConfig()
    if isinstance(backbone, str):
        backbone = load_backbone(backbone)
    base_fingerprint = backbone.fingerprint()
    torch.manual_seed(train_config.seed)  # the LoRA initialisation
    model = backbone.model if inplace else copy.deepcopy(backbone.model)
    tuner = inject(model, config, backbone.name)
    lora = list(lora_parameters(model).values())
    model.train()  # LoRA dropout; ``freeze`` below puts the merged model back in eval mode
    group = config.param_group(lora)
    _train_with_temporary_rows(backbone, model, examples, train_config, group, config.memory_tokens, on_step)
    digest = _digest(base_fingerprint, lora)
    merged = tuner.merge_and_unload()
    freeze(merged)
    setattr(merged.config, ADAPTATION_KEY, digest)
    adapted = Backbone(f"{backbone.name}+adapted-{digest[:8]}", merged, backbone.tokenizer)
    adapted = adapted if save_to is None else save_backbone(adapted, save_to)
    if train_config.checkpoint and distributed.is_main():
        remove_checkpoint(train_config.checkpoint)
    return adapted


def _train_with_temporary_rows(
    backbone, lora_model, examples, train_config, lora_group, memory_tokens, on_step=None
) -> None:
    """Train a fresh bank of every procedure in ``examples`` together with the LoRA weights; the bank is dropped.

    ``lora_model`` is the transformers model with the LoRA layers injected (``tokmem.training.lora.inject``).
    """
    bank = MemoryBank(backbone.hidden_size, memory_tokens=memory_tokens)
    model = TokMemModel(Backbone(backbone.name, lora_model, backbone.tokenizer), bank)
    names = list(dict.fromkeys(p for e in examples for p in e.procedures))
    model.bank.add(
        names,
        initial_rows(backbone, row_texts(names), train_config.init, train_config.seed),
        kinds=row_kinds(names, examples, train_config),
    )
    report = train(
        model, examples, replace(train_config, refit_index=False), param_groups=[lora_group], on_step=on_step
    )
    log.info("adaptation on %d procedures: %s", len(model.bank), report.summary())


def _digest(base_fingerprint: str, lora: list[torch.nn.Parameter]) -> str:
    """The adaptation's identity: the base model's fingerprint and the trained LoRA weights."""
    digest = hashlib.sha256(base_fingerprint.encode())
    for parameter in lora:
        digest.update(parameter.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def save_backbone(backbone: Backbone, directory) -> Backbone:
    """Save the model and tokenizer to a new ``directory`` (written aside, then renamed into place);
    returns the backbone named by the directory's absolute path, which ``load_backbone`` takes.
    Under a launcher the main process writes and the others wait for it."""
    target = Path(directory).resolve()
    if distributed.is_main():
        _write_backbone(backbone, target)
    distributed.barrier()
    return Backbone(str(target), backbone.model, backbone.tokenizer)


def _write_backbone(backbone: Backbone, target: Path) -> None:
    if target.exists():
        raise BackboneError(f"{target} already exists: save the backbone to a new directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    try:
        backbone.model.save_pretrained(staging)
        backbone.tokenizer.save_pretrained(staging)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def adaptation_key(backbone: Backbone, examples: list[Example], config: AdaptConfig, train_config: TrainConfig) -> str:
    """What makes an adapted backbone: the base model's fingerprint, the data and every training setting
    (not the progress or checkpoint options, nor ``refit_index``: the temporary rows are never refit).  Two
    adaptations with the same key give the same model."""
    digest = hashlib.sha256(backbone.fingerprint().encode())
    for example in examples:
        digest.update(json.dumps(example.to_json(), sort_keys=True, ensure_ascii=False).encode())
    rows = {
        k: v
        for k, v in asdict(train_config).items()
        if k not in (*RUN_ONLY, "bf16", "refit_index")  # the run's, and settings that do not change it
        and not (k in LOSS_WEIGHTS and v == getattr(TrainConfig, k))  # added later: keys kept from before
    }
    lora = {
        k: v for k, v in asdict(config).items() if (k, v) != ("memory_tokens", MEMORY_TOKENS)
    }  # keys kept from before
    digest.update(json.dumps([lora, rows], sort_keys=True).encode())
    return digest.hexdigest()[:16]


def cached_adapt(
    backbone: Backbone,
    examples: list[Example],
    config: AdaptConfig | None = None,
    train_config: TrainConfig | None = None,
    cache=None,
    on_step=None,
) -> tuple[Backbone, Path, bool]:
    """``adapt`` once per key (``adaptation_key``): the adapted backbone is saved under ``cache`` (default
    ``<tokmem cache>/adapted``) and later calls with the same backbone, data and settings load it.  Until it is,
    the phase is checkpointed beside it every ``CACHE_CHECKPOINT_EVERY`` steps (``<key>.checkpoint.safetensors``),
    and a call after an interrupted one goes on from there (``on_step``: as in ``adapt``).
    Returns the backbone, its directory and whether it came from the cache."""
    config, train_config = config or AdaptConfig(), train_config or TrainConfig()
    directory = Path(cache or cache_dir() / "adapted") / adaptation_key(backbone, examples, config, train_config)
    if directory.is_dir():
        return load_backbone(str(directory), device=str(backbone.device)), directory, True
    checkpoint = directory.with_name(f"{directory.name}.checkpoint.safetensors")
    resumable = replace(train_config, checkpoint=str(checkpoint), checkpoint_every=CACHE_CHECKPOINT_EVERY, resume=True)
    return adapt(backbone, examples, config, resumable, save_to=directory, on_step=on_step), directory, False
