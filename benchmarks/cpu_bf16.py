"""The frozen backbone in bf16 against float32 on a CPU: TokMem's training step and decoding, timed in both.

One backbone is loaded in float32 and converted in place (so only one copy is ever in memory), and the dtypes are
timed in the order float32, bf16, float32 (from the rounded weights: the time, not the values, is what it measures
there), each dtype after an untimed warm-up, so that a change in the machine's load during the run shows as a difference between the two float32
phases.  Each phase trains fresh TokMem rows (float32 rows and optimiser state, as always) for one epoch on the
built-in demo's training queries with ``tokmem.learn``, then decodes held-out queries with ``tokmem.generate``.
Whether bf16 keeps the scores is a separate, longer check (the demo in both dtypes: docs/scale.md).

    python benchmarks/cpu_bf16.py --backbone smollm2-135m --json results/cpu_bf16-smollm2.json
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from tokmem import DecodeConfig, TrainConfig, create, generate, learn, load_backbone
from tokmem.backbones import cpu_has_bf16
from tokmem.data.builtin import demo_dataset
from tokmem.report import console, machine, write_json
from tokmem.cli.options import add_backbone

PHASES = (torch.float32, torch.bfloat16, torch.float32)


def phase(backbone, train, queries, batch_size: int, max_new_tokens: int) -> dict:
    """Training tokens/s and decoding seconds a query in the backbone's current dtype."""
    model = create(backbone)
    report = learn(model, train, TrainConfig(batch_size=batch_size, progress=False))
    start = time.perf_counter()
    generate(model, queries, DecodeConfig(max_new_tokens=max_new_tokens, batch_size=batch_size))
    decode = (time.perf_counter() - start) / len(queries)
    return {"train_tokens_per_s": report.tokens_per_s, "decode_s_per_query": decode, "final_loss": report.losses[-1]}


def run(args) -> dict:
    torch.manual_seed(0)
    load_before = os.getloadavg()
    backbone = load_backbone(args.backbone, device="cpu", dtype=torch.float32)
    train, test = demo_dataset(seed=0)
    train, queries = train[: args.train], [e.query for e in test[: args.queries]]
    phases, warm = [], set()
    for dtype in PHASES:
        backbone.model.to(dtype)
        if dtype not in warm:  # one untimed step and query first: kernels are chosen on first use
            phase(backbone, train[: args.batch_size], queries[:1], args.batch_size, args.max_new_tokens)
            warm.add(dtype)
        phases.append(
            {
                "dtype": str(dtype).removeprefix("torch."),
                **phase(backbone, train, queries, args.batch_size, args.max_new_tokens),
            }
        )
    float32 = [p for p in phases if p["dtype"] == "float32"]
    bf16 = phases[1]
    return {
        "backbone": args.backbone,
        "cpu_has_bf16": cpu_has_bf16(),
        "train_examples": len(train),
        "queries": len(queries),
        "phases": phases,
        "train_speedup": bf16["train_tokens_per_s"] / (sum(p["train_tokens_per_s"] for p in float32) / 2),
        "decode_speedup": (sum(p["decode_s_per_query"] for p in float32) / 2) / bf16["decode_s_per_query"],
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_backbone(parser)
    parser.add_argument("--train", type=int, default=64, help="training queries (one epoch)")
    parser.add_argument("--queries", type=int, default=16, help="held-out queries decoded")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    result = run(args)
    for p in result["phases"]:
        console.print(
            f"{p['dtype']:>9}: training {p['train_tokens_per_s']:.0f} tokens/s, decoding {p['decode_s_per_query']:.2f} s a query"
        )
    console.print(
        f"bf16 / float32 (mean of the two float32 phases): training {result['train_speedup']:.2f}×, decoding "
        f"{result['decode_speedup']:.2f}×; load {result['load_average_before']}"
    )
    if args.json:
        write_json(args.json, {**result, "machine": machine()})


if __name__ == "__main__":
    main()
