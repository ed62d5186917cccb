"""Training throughput and model FLOP utilisation: TokMem (epoch 1, and epochs 2+ with the query prefixes kept)
against LoRA r=8 at its best batch, on the same examples in the same run, each through the library's own training
(``tokmem.learn`` for TokMem, the LoRA baseline ``research.methods.lora.LoRA`` for LoRA).

Workloads: ``demo`` (the built-in procedures; needs no data), ``sni`` (Super-Natural Instructions training sequences
as the atomic study lays them out: the task definition and input, one memory token, the answer) and ``cfb``
(ComplexFuncBench records with their tools' results: the tool loop's sequences, where the results are read but not
trained on).  Seconds are per epoch over the workload's examples; tokens/s count each method's own sequences
(LoRA's have the call text where TokMem has a memory token).  LoRA trains two epochs at each batch of
``--lora-batches``: its second epoch is timed and the fastest batch reported.  The methods run one after another, so
a change in the machine's load between them shows in their ratio: the JSON records the load average around the run.
TokMem runs twice: as the library trains by default, and with ``--segment-backprop`` (``tokmem_segments_*``: the tool
loop's approximation, each call back-propagated alone, the results read without gradients; the same as the default on
records of one segment).

FLOPs per token are counted once, untimed, by ``torch.utils.flop_counter`` over one batch spread over the workload (TokMem:
epoch 1 and epoch 2 apart; what the forward and backward passes actually run: a frozen backbone's backward computes
no weight gradients).  The peak is a large square matrix product in the backbone's dtype, timed in the same run, so
the utilisation (FLOP/s achieved over FLOP/s of that product) needs no datasheet.

    python benchmarks/train_throughput.py --backbone smollm2-135m --workload sni --json runs/throughput.json
    python benchmarks/train_throughput.py --backbone /tmp/qwen/qwen2.5-coder-0.5b-instruct.gguf --workload cfb \\
        --examples 8 --batch-size 2 --lora-batches 1,2 --json results/train_throughput-qwen0.5b-cfb.json
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from tokmem import TrainConfig, create, learn, load_backbone
from tokmem.backbones import DEVICE_HELP
from tokmem.cli.options import add_backbone
from tokmem.data.procedures import Example
from tokmem.report import console, machine, write_json
from tokmem.training.sequences import encode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: research/ beside src/
from research.methods.lora import LoRA  # noqa: E402

WORKLOADS = ("demo", "sni", "cfb")
MAX_LENGTH = {"demo": 1024, "sni": 1024, "cfb": 1536}  # cfb: the tool-loop study's, which keeps its records whole
SNI_PER_TASK = 4


@dataclass
class Workload:
    examples: list[Example]
    schemas: dict[str, dict] | None  # the tools' argument schemas (cfb): TokMem's rows lay out arguments only
    max_length: int


def workload(name: str, count: int) -> Workload:
    """The first ``count`` training examples of the workload, in a fixed order."""
    from tokmem.data.shared import shared_data

    if name == "demo":
        from tokmem.data.builtin import demo_dataset

        return Workload(demo_dataset(seed=0)[0][:count], None, MAX_LENGTH[name])
    if name == "sni":
        from tokmem.data.sni import load_tasks

        tasks, _ = load_tasks(shared_data("sni", "tasks"), math.ceil(count / SNI_PER_TASK), SNI_PER_TASK)
        return Workload([e for task in tasks for e in task.examples()][:count], None, MAX_LENGTH[name])
    from tokmem.data.nestful import import_nestful

    imported = import_nestful(shared_data("function-calling", "complexfuncbench", "complexfuncbench-data.json.gz"))
    examples = [e for e in imported.examples if len(e.steps) <= 4][:count]
    schemas = {name: tool.get("parameters") for name, tool in imported.catalog.items()}
    return Workload(examples, schemas, MAX_LENGTH[name])


def epoch_seconds(stamps: list[float], start: float, steps_per_epoch: int) -> list[float]:
    """Seconds of each epoch from the end times of its optimiser steps."""
    ends = [start, *stamps[steps_per_epoch - 1 :: steps_per_epoch]]
    return [b - a for a, b in zip(ends, ends[1:])]


def tokmem_epochs(backbone, work: Workload, batch_size: int, epochs: int, segment_backprop: bool = False) -> dict:
    """TokMem's seconds per epoch (``tokmem.learn``, the default prefix store; ``segment_backprop``: the tool loop's
    approximation, ``TrainConfig.segment_backprop``), its tokens an epoch and its last step's loss."""
    stamps = []
    config = TrainConfig(
        epochs=epochs,
        batch_size=batch_size,
        max_length=work.max_length,
        segment_backprop=segment_backprop,
        progress=False,
    )
    model = create(backbone)
    report = learn(
        model, work.examples, config, schemas=work.schemas, on_step=lambda *_: stamps.append(time.perf_counter())
    )
    start = stamps[-1] - report.seconds  # the training loop's start
    seconds = epoch_seconds(stamps, start, math.ceil(len(work.examples) / batch_size))
    return {
        "seconds": seconds,
        "tokens": report.tokens / epochs,
        "padding_share": 1 - report.tokens / report.positions,  # of the collated batches' positions
        "prefix_cache_bytes": report.prefix_cache_bytes,
        "final_loss": report.losses[-1],
    }


def lora_epoch(backbone, work: Workload, batch_size: int) -> float:
    """Seconds of LoRA's second epoch (the first warms it up) at ``batch_size``."""
    method = LoRA(backbone, TrainConfig(batch_size=batch_size, epochs=2, max_length=work.max_length))
    stamps = []
    method.on_step = lambda _: stamps.append(time.perf_counter())
    method.learn(work.examples)
    return stamps[-1] - stamps[len(stamps) // 2 - 1]


def lora_tokens(backbone, work: Workload) -> int:
    """Tokens of LoRA's sequences over the examples (its layout: the call text in the memory token's place)."""
    tokenizer = backbone.tokenizer
    return sum(len(encode(e, tokenizer, None, work.max_length).input_ids) for e in work.examples)


def counted_flops(backbone, work: Workload, batch_size: int) -> dict:
    """FLOPs per token over one batch: TokMem's epoch 1 and epoch 2 (one step each), the same with
    ``segment_backprop``, LoRA's one step.  The batch takes evenly spaced examples, as a shuffled one would (the
    workloads come in task order, and examples of one SNI task share their definition, which a batch's shared-prefix
    pass encodes once)."""
    first = Workload(work.examples[:: len(work.examples) // batch_size][:batch_size], work.schemas, work.max_length)
    epoch1, epoch2 = tokmem_flops(backbone, first, batch_size, False)
    counter = FlopCounterMode(display=False)
    with counter:
        LoRA(backbone, TrainConfig(batch_size=batch_size, epochs=1, max_length=work.max_length)).learn(first.examples)
    return {
        "tokmem_epoch1": epoch1,
        "tokmem_epoch2": epoch2,
        "tokmem_segments_epoch2": tokmem_flops(backbone, first, batch_size, True)[1],
        "lora": counter.get_total_flops() / lora_tokens(backbone, first),
    }


def tokmem_flops(backbone, batch: Workload, batch_size: int, segment_backprop: bool) -> tuple[float, float]:
    """TokMem's FLOPs per token in epoch 1 and epoch 2 of two one-step epochs over ``batch``."""
    counter, marks = FlopCounterMode(display=False), []
    config = TrainConfig(
        epochs=2, batch_size=batch_size, max_length=batch.max_length, segment_backprop=segment_backprop, progress=False
    )
    with counter:
        report = learn(
            create(backbone),
            batch.examples,
            config,
            schemas=batch.schemas,
            on_step=lambda *_: marks.append(counter.get_total_flops()),
        )
    tokens = report.tokens / 2
    return marks[0] / tokens, (marks[1] - marks[0]) / tokens


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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


def run(args) -> dict:
    torch.manual_seed(0)
    load_before = os.getloadavg()
    dtype = getattr(torch, args.dtype) if args.dtype else None
    backbone = load_backbone(args.backbone, device=args.device, dtype=dtype)
    device = backbone.device
    work = workload(args.workload, args.examples)
    n = len(work.examples)
    if any(n % b for b in (args.batch_size, *args.lora_batches)):
        raise SystemExit(f"--examples ({n}) must be a multiple of --batch-size and of every --lora-batches")
    flops = counted_flops(backbone, work, args.batch_size)  # also warms both methods up
    tokmem = tokmem_epochs(backbone, work, args.batch_size, args.epochs)
    segments = tokmem_epochs(backbone, work, args.batch_size, args.epochs, segment_backprop=True)
    lora = {b: lora_epoch(backbone, work, b) for b in args.lora_batches}
    best = min(lora, key=lora.get)
    peak = matmul_peak(device, backbone.model.dtype, args.peak_size)
    epoch1, later = tokmem["seconds"][0], statistics.mean(tokmem["seconds"][1:])
    segments_later = statistics.mean(segments["seconds"][1:])
    tokens, tokens_lora = tokmem["tokens"], lora_tokens(backbone, work)
    result = {
        "backbone": args.backbone,
        "workload": args.workload,
        "device": str(device),
        "dtype": str(backbone.model.dtype).removeprefix("torch."),
        "examples": n,
        "batch_size": args.batch_size,
        "epochs": args.epochs,
        "tokmem_tokens_per_epoch": tokens,
        "lora_tokens_per_epoch": tokens_lora,
        "tokmem_epoch_s": tokmem["seconds"],
        "tokmem_epoch1_tokens_per_s": tokens / epoch1,
        "tokmem_epoch2_tokens_per_s": tokens / later,
        "lora_batch_size": best,
        "lora_epoch_s_by_batch": lora,
        "lora_epoch_s": lora[best],
        "lora_tokens_per_s": tokens_lora / lora[best],
        "tokmem_epoch2_over_lora_tokens_per_s": tokens / later / (tokens_lora / lora[best]),
        "tokmem_epoch2_speedup_per_epoch": lora[best] / later,
        "tokmem_epoch1_speedup_per_epoch": lora[best] / epoch1,
        "peak_flops": peak,
        "flops_per_token": flops,
        "tokmem_epoch1_mfu": flops["tokmem_epoch1"] * tokens / epoch1 / peak,
        "tokmem_mfu": flops["tokmem_epoch2"] * tokens / later / peak,
        "lora_mfu": flops["lora"] * tokens_lora / lora[best] / peak,
        "tokmem_segments_epoch_s": segments["seconds"],
        "tokmem_segments_epoch2_tokens_per_s": tokens / segments_later,
        "tokmem_segments_over_tokmem_epoch2": later / segments_later,
        "tokmem_segments_epoch2_over_lora_tokens_per_s": tokens / segments_later / (tokens_lora / lora[best]),
        "tokmem_segments_mfu": flops["tokmem_segments_epoch2"] * tokens / segments_later / peak,
        "tokmem_final_loss": tokmem["final_loss"],
        "tokmem_segments_final_loss": segments["final_loss"],
        "padding_share": tokmem["padding_share"],
        "prefix_cache_bytes": tokmem["prefix_cache_bytes"],
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
    }
    if device.type == "cuda":
        result["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_backbone(parser)
    parser.add_argument("--device", default=None, help=DEVICE_HELP)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), help="the backbone's (default: the library's)")
    parser.add_argument("--workload", choices=WORKLOADS, default="demo")
    parser.add_argument("--examples", type=int, default=16, help="training examples (the first of the workload)")
    parser.add_argument("--batch-size", type=int, default=4, help="TokMem's batch")
    parser.add_argument("--epochs", type=int, default=3, help="TokMem's epochs (at least 2)")
    parser.add_argument(
        "--lora-batches", type=lambda s: tuple(map(int, s.split(","))), default=(2, 4, 8), help="LoRA's batches tried"
    )
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
    seconds = ", ".join(f"{s:.1f}" for s in result["tokmem_epoch_s"])
    console.print(
        f"TokMem epochs {seconds} s: {result['tokmem_epoch1_tokens_per_s']:.0f} tokens/s in epoch 1, "
        f"{result['tokmem_epoch2_tokens_per_s']:.0f} in epochs 2+ (MFU {result['tokmem_mfu']:.1%}; "
        f"prefixes kept: {result['prefix_cache_bytes'] / 2**20:.0f} MiB; padding {result['padding_share']:.1%})"
    )
    console.print(
        f"LoRA r=8 at batch {result['lora_batch_size']}: {result['lora_epoch_s']:.1f} s an epoch, "
        f"{result['lora_tokens_per_s']:.0f} tokens/s (MFU {result['lora_mfu']:.1%}); TokMem epochs 2+ / LoRA: "
        f"{result['tokmem_epoch2_over_lora_tokens_per_s']:.2f}× tokens/s, {result['tokmem_epoch2_speedup_per_epoch']:.2f}× "
        f"an epoch; peak {result['peak_flops'] / 1e12:.2f} TFLOP/s ({result['dtype']}); load {result['load_average_before']}"
    )
    console.print(
        f"TokMem with --segment-backprop: epochs {', '.join(f'{s:.1f}' for s in result['tokmem_segments_epoch_s'])} s, "
        f"{result['tokmem_segments_epoch2_tokens_per_s']:.0f} tokens/s in epochs 2+ "
        f"({result['tokmem_segments_over_tokmem_epoch2']:.2f}× TokMem's, "
        f"{result['tokmem_segments_epoch2_over_lora_tokens_per_s']:.2f}× LoRA's; MFU {result['tokmem_segments_mfu']:.1%}); "
        f"final loss {result['tokmem_segments_final_loss']:.3f} against {result['tokmem_final_loss']:.3f}"
    )
    if args.json:
        write_json(args.json, {**result, "machine": machine()})


if __name__ == "__main__":
    main()
