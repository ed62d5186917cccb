"""Data-parallel training under ``torchrun`` / ``accelerate launch``: the few collective operations it needs.

Every process holds the whole frozen backbone and the same bank, so nothing is broadcast and no DDP
wrapper is needed: each rank takes its share of every optimiser step's examples, the loss is
normalised by the step's global count of target tokens, and the trainable parameters' gradients (the
bank rows, and LoRA weights where they train too) are summed across ranks before the optimiser step.
N processes at batch b then take the same steps as one process at batch N·b.

A backbone too large for one device can have its decoder layers sharded across the processes (``shard_layers``,
FSDP2's ``fully_shard``, one unit a layer): each layer is gathered for its forward and backward and freed after.
Only the layers: TokMem calls the input embedding and the LM head itself (not through the causal LM's forward),
and a tied embedding and head could not sit in two units; both are small next to the layers.  The bank stays
replicated and its gradient summed as above.  Every rank must then run the same passes through the layers, so
the training step evens out micro-batch counts (``global_max``) and the model its branch choices (``all_ranks``).

A launcher sets ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK`` and the rendezvous address; the process group
starts on first use (NCCL with CUDA, gloo on CPU).  Without a launcher every function here is the
single-process identity.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def launched() -> bool:
    """Whether a launcher started this process as one of several."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def start(device: torch.device) -> None:
    """Join the launcher's process group, once (a no-op for a single process)."""
    if launched() and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def is_main() -> bool:
    """The process that writes files and shows progress."""
    return rank() == 0


def shard(items: list, rank_: int | None = None, world: int | None = None) -> list:
    """This rank's contiguous share of one optimiser step's items (the first ranks take one more when uneven)."""
    rank_ = rank() if rank_ is None else rank_
    world = world_size() if world is None else world
    size, extra = divmod(len(items), world)
    start_at = rank_ * size + min(rank_, extra)
    return items[start_at : start_at + size + (rank_ < extra)]


def global_sum(value: int | float, device: torch.device) -> float:
    """``value`` summed over all ranks."""
    if world_size() == 1:
        return value
    total = torch.tensor(float(value), dtype=torch.float64, device=device)
    dist.all_reduce(total)
    return total.item()


def global_max(value: int, device: torch.device) -> int:
    """The largest ``value`` over all ranks."""
    if world_size() == 1:
        return value
    largest = torch.tensor(value, dtype=torch.long, device=device)
    dist.all_reduce(largest, op=dist.ReduceOp.MAX)
    return int(largest.item())


def all_ranks(flag: torch.Tensor | bool) -> bool:
    """Whether ``flag`` holds on every rank."""
    flag = torch.as_tensor(flag, dtype=torch.long).reshape(1)
    if world_size() > 1:
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def shard_layers(lm: torch.nn.Module, device: torch.device) -> None:
    """Shard ``lm``'s decoder layers across the ranks (FSDP2, one unit a layer), then move it to ``device``: only
    each rank's shards of the layers land there.  Load the backbone on the CPU first for a model that does not fit
    one device.  A no-op in one process."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    from tokmem.errors import TokMemError

    layers = _decoder_layers(lm)
    if layers is None:
        raise TokMemError(
            f"fsdp: cannot find the decoder layers of {type(lm).__name__} (expected base_model.layers, as in Llama, "
            "Qwen2 and Mistral models)"
        )
    if world_size() > 1 and not isinstance(layers[0], FSDPModule):
        for layer in layers:
            fully_shard(layer)
    lm.to(device)


def layers_sharded(lm: torch.nn.Module) -> bool:
    """Whether ``shard_layers`` sharded ``lm``'s decoder layers."""
    from torch.distributed.fsdp import FSDPModule

    layers = _decoder_layers(lm)
    return layers is not None and isinstance(layers[0], FSDPModule)


def _decoder_layers(lm: torch.nn.Module) -> torch.nn.ModuleList | None:
    """The causal LM's decoder layers (``base_model.layers``, as in Llama, Qwen2 and Mistral), or None."""
    layers = getattr(lm.base_model, "layers", None)
    return layers if isinstance(layers, torch.nn.ModuleList) and len(layers) else None


def sum_gradients(parameters: list[torch.nn.Parameter]) -> None:
    """Sum the gradients of ``parameters`` over all ranks, in one flat collective."""
    if world_size() == 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    for p, piece in zip(parameters, flat.split([g.numel() for g in grads])):
        p.grad = piece.view_as(p).to(p.dtype)


def barrier() -> None:
    """Wait until every rank is here (e.g. until the main process has written a file the others read)."""
    if world_size() > 1:
        dist.barrier()
