"""Training throughput and model FLOP utilisation: the TokMem step against a LoRA step (and a naive
resized-vocabulary step), on the same batches in the same run.

  tokmem  only the bank rows are parameters; vocabulary logits only at labelled positions
  lora    PEFT LoRA r=8 on q_proj and v_proj (memory ids replaced by EOS: it has no memory tokens)
  naive   the usual recipe: resize the vocabulary, make the whole embedding matrix trainable and
          mask the gradient of the old rows; full logits at every position

Each method's FLOPs per batch are counted once, untimed, by ``torch.utils.flop_counter`` (the matrix
products and attention its forward and backward actually run: a frozen backbone's backward computes no
weight gradients).  The peak is a large square matrix product in the backbone's dtype, timed in the
same run, so the utilisation (FLOP/s achieved over FLOP/s of that product) needs no datasheet.
The batches are the built-in demo procedures laid out as ``tokmem.train`` lays them out; with
``--length-grouped`` they are ordered as ``TrainConfig(length_grouped=True)`` orders them.  The JSON
reports the share of the steps' tokens that are padding, and the share that repeats a prompt prefix
already in the same batch (the chat template's system text, for instance).

    python benchmarks/train_throughput.py [--backbone smollm2-135m] [--steps 6] --json runs/throughput.json
    python benchmarks/train_throughput.py --backbone random:llama-3.2-1b --device cuda --batch-size 32 ...
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from tokmem import TrainConfig, create, load_backbone
from tokmem.data.builtin import demo_dataset
from tokmem.sequences import collate, encode, to_device
from tokmem.report import console, machine, write_json
from tokmem.train import example_order, step_context


def batches(model, batch_size: int, count: int, length_grouped: bool) -> list[dict]:
    """``count`` batches of the demo's training examples, in training order, on the model's device."""
    train, _ = demo_dataset(seed=0)
    model.bank.add(sorted({p for e in train for p in e.procedures}), model.backbone.mean_embedding())
    tokenizer = model.backbone.tokenizer
    encoded = [encode(e, tokenizer, model.memory_id, 1024) for e in train]
    config = TrainConfig(
        batch_size=batch_size, length_grouped=length_grouped, epochs=1 + batch_size * count // len(train)
    )
    order = example_order([len(e.input_ids) for e in encoded], config)[: batch_size * count]
    chunks = [[encoded[i] for i in order[j : j + batch_size]] for j in range(0, len(order), batch_size)]
    device = model.device
    return [to_device(collate(chunk, tokenizer.pad_token_id), device) for chunk in chunks]


def tokmem_step(model):
    optimizer = torch.optim.AdamW(model.unfreeze_rows(), lr=5e-3, weight_decay=0.0)

    def step(batch):
        optimizer.zero_grad(set_to_none=True)
        loss, _ = model.loss(batch)
        loss.backward()
        optimizer.step()

    return step


def naive_step(backbone, rows: int):
    lm = copy.deepcopy(backbone.model)
    vocab = backbone.vocab_size
    lm.resize_token_embeddings(vocab + rows, mean_resizing=False)
    weight = lm.get_input_embeddings().weight
    weight.requires_grad_(True)
    weight.register_hook(lambda grad: torch.cat([torch.zeros_like(grad[:vocab]), grad[vocab:]]))
    optimizer = torch.optim.AdamW([weight], lr=5e-3, weight_decay=0.0)

    def step(batch):
        optimizer.zero_grad(set_to_none=True)
        lm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]).loss.backward()
        optimizer.step()

    return step


def lora_step(backbone):
    from peft import LoraConfig, get_peft_model

    lm = get_peft_model(
        copy.deepcopy(backbone.model), LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
    )
    optimizer = torch.optim.AdamW([p for p in lm.parameters() if p.requires_grad], lr=5e-5, weight_decay=0.01)
    vocab, eos = backbone.vocab_size, backbone.eos_token_id

    def step(batch):
        ids = batch["input_ids"].masked_fill(batch["input_ids"] >= vocab, eos)
        labels = batch["labels"].masked_fill(batch["labels"] >= vocab, eos)
        optimizer.zero_grad(set_to_none=True)
        lm(input_ids=ids, attention_mask=batch["attention_mask"], labels=labels).loss.backward()
        optimizer.step()

    return step


def in_step_context(step, device: torch.device):
    """``step`` run as ``tokmem.train`` runs its steps (autocast and attention kernels), for every method alike."""

    def run(batch):
        with step_context(device):
            step(batch)

    return run


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds_per_batch(steps: dict, data: list[dict], device, warmup: int = 1) -> dict[str, list[float]]:
    """Each step function's time on each batch after ``warmup`` batches; the methods take turns batch by
    batch, so that a change in the machine's load during the run affects them alike."""
    seconds = {name: [] for name in steps}
    for i, batch in enumerate(data):
        for name, step in steps.items():
            synchronize(device)
            start = time.perf_counter()
            step(batch)
            synchronize(device)
            if i >= warmup:
                seconds[name].append(time.perf_counter() - start)
    return seconds


def counted_flops(step, data: list[dict]) -> int:
    """FLOPs of the matrix products and attention that ``step`` runs over ``data`` (forward and backward)."""
    counter = FlopCounterMode(display=False)
    with counter:
        for batch in data:
            step(batch)
    return counter.get_total_flops()


def matmul_peak(device: torch.device, dtype: torch.dtype, size: int, repeats: int = 10) -> float:
    """FLOP/s of a ``size``³ matrix product in ``dtype`` on ``device``: the median of ``repeats`` timed runs."""
    generator = torch.Generator(device=device).manual_seed(0)
    a, b = (torch.randn(size, size, device=device, dtype=dtype, generator=generator) for _ in range(2))
    times = []
    for i in range(repeats + 2):
        synchronize(device)
        start = time.perf_counter()
        a @ b
        synchronize(device)
        if i >= 2:
            times.append(time.perf_counter() - start)
    return 2 * size**3 / statistics.median(times)


def token_shares(data: list[dict]) -> tuple[float, float]:
    """(padding share, repeated-prefix share) of all positions in the batches.

    A batch's repeated prefix is the prompt prefix its rows share, counted once per row after the first.
    """
    padding = prefix = total = 0
    for batch in data:
        ids, mask = batch["input_ids"].cpu(), batch["attention_mask"].cpu()
        total += ids.numel()
        padding += int((mask == 0).sum())
        same = (ids == ids[:1]).all(dim=0).int()
        prefix += int(same.cumprod(0).sum()) * (len(ids) - 1)
    return padding / total, prefix / total


def run(args) -> dict:
    torch.manual_seed(0)
    backbone = load_backbone(args.backbone, device=args.device)
    device, dtype = backbone.device, backbone.model.dtype
    model = create(backbone)
    data = batches(model, args.batch_size, args.steps + 1, args.length_grouped)
    steps = {"tokmem": tokmem_step(model), "lora": lora_step(backbone)}
    if not args.no_naive:
        steps["naive"] = naive_step(backbone, len(model.bank))
    steps = {name: in_step_context(step, device) for name, step in steps.items()}
    seconds = seconds_per_batch(steps, data, device)
    timed = data[1:]
    tokens = sum(int(b["attention_mask"].sum()) for b in timed)
    peak = matmul_peak(device, dtype, args.peak_size)
    padding, prefix = token_shares(timed)
    result = {
        "backbone": args.backbone,
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "batch_size": args.batch_size,
        "steps": args.steps,
        "length_grouped": args.length_grouped,
        "tokens": tokens,
        "padding_share": padding,
        "prefix_share": prefix,
        "peak_flops": peak,
    }
    for name, step in steps.items():
        rate = tokens / sum(seconds[name])
        flops = counted_flops(step, timed)
        result[f"{name}_tokens_per_s"] = rate
        result[f"{name}_flops_per_token"] = flops / tokens
        result[f"{name}_mfu"] = flops / sum(seconds[name]) / peak
        result[f"{name}_step_s_median"] = statistics.median(seconds[name])
    result["tokmem_over_lora"] = result["tokmem_tokens_per_s"] / result["lora_tokens_per_s"]
    if device.type == "cuda":
        result["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backbone", default="smollm2-135m", help="any backbone spec, e.g. random:llama-3.2-1b")
    parser.add_argument("--device", default=None, help="cpu, cuda, … (default: cuda when available)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6, help="timed steps per method (after one warm-up step)")
    parser.add_argument(
        "--length-grouped", action="store_true", help="order the batches as TrainConfig(length_grouped=True)"
    )
    parser.add_argument("--no-naive", action="store_true", help="leave out the naive resized-vocabulary step")
    parser.add_argument(
        "--peak-size",
        type=int,
        default=None,
        help="side of the peak matrix product (default: 8192 on GPU, 2048 on CPU)",
    )
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    on_gpu = (args.device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    args.peak_size = args.peak_size or (8192 if on_gpu else 2048)
    result = run(args)
    for name in ("tokmem", "lora", "naive"):
        if f"{name}_tokens_per_s" in result:
            console.print(
                f"{name:>7}: {result[f'{name}_tokens_per_s']:.0f} tokens/s, "
                f"{result[f'{name}_flops_per_token'] / 1e9:.2f} GFLOP/token, MFU {result[f'{name}_mfu']:.1%}"
            )
    console.print(
        f"tokmem / lora: {result['tokmem_over_lora']:.2f}×; peak {result['peak_flops'] / 1e12:.2f} TFLOP/s "
        f"({result['dtype']}); padding {result['padding_share']:.1%}, repeated prefix {result['prefix_share']:.1%}"
    )
    if args.json:
        write_json(args.json, {**result, "machine": machine()})


if __name__ == "__main__":
    main()
