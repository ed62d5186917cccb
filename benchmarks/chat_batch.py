"""Answering many tool-loop conversations: ``tokmem.chat`` one conversation at a time against ``tokmem.chat_batch``.

The tool-loop study's per-step pass on ComplexFuncBench records with their recorded results: step by step, each
record's conversation so far (query, gold calls, results) gets its next call, every conversation keeping its KV
cache across steps.  Both ways run in the same process on the same bank (the data's tools, rows at the mean
embedding plus seeded noise: speed does not depend on training) and must give the same calls (``same_calls``) —
exactly so in float32 (``TOKMEM_CPU_BF16=0``: True, 42 steps, 2.40×); in bf16, this CPU's default, a padded batch
rounds differently from one conversation alone and a near-tie can flip a token, so there it may be False.

    PYTHONPATH=src python benchmarks/chat_batch.py --records 16 --json results/chat_batch.json
"""

from __future__ import annotations

import argparse
import time

import torch

import tokmem
from tokmem.data.nestful import import_nestful
from tokmem.data.shared import shared_data
from tokmem.report import machine, write_json
from tokmem.eval.tool_loop import conversation
from tokmem.cli.options import add_backbone


def per_step(model, records, config, batched: bool) -> tuple[list, float]:
    """Every record's predicted calls, step by step with the gold history in context, and the seconds it took."""
    caches = [tokmem.ChatCache() for _ in records]
    calls: list = []
    start = time.perf_counter()
    for k in range(max(len(r.steps) for r in records)):
        due = [i for i, r in enumerate(records) if k < len(r.steps)]
        messages = [conversation(records[i], [(s.response, s.result) for s in records[i].steps[:k]]) for i in due]
        if batched:
            replies = tokmem.chat_batch(
                model, messages, tool_choice="required", config=config, caches=[caches[i] for i in due]
            )
        else:
            replies = [
                tokmem.chat(model, m, tool_choice="required", config=config, cache=caches[i])
                for m, i in zip(messages, due)
            ]
        calls += [(c.name, c.arguments) for reply in replies for c in reply.tool_calls]
    return calls, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_backbone(parser)
    parser.add_argument("--records", type=int, default=16, help="records with 2–4 calls")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--json", default="results/chat_batch.json")
    args = parser.parse_args()
    data = shared_data("function-calling", "complexfuncbench", "complexfuncbench-data.json.gz")
    imported = import_nestful(data, results=True)
    records = [e for e in imported.examples if 2 <= len(e.steps) <= 4][: args.records]
    model = tokmem.create(args.backbone, device="cpu")
    tools = sorted({s.procedure for r in records for s in r.steps})
    model.bank.add(
        tools,
        model.backbone.mean_embedding(),
        kinds=["tool"] * len(tools),
        schemas=[imported.catalog[t]["parameters"] for t in tools],
    )
    model.bank.index = model.bank.index + torch.randn(model.bank.index.shape, generator=torch.manual_seed(0)) * 0.02
    config = tokmem.DecodeConfig(max_new_tokens=args.max_new_tokens, batch_size=args.batch_size)
    one, one_s = per_step(model, records, config, batched=False)
    many, many_s = per_step(model, records, config, batched=True)
    steps = sum(len(r.steps) for r in records)
    write_json(
        args.json,
        {
            "command": f"PYTHONPATH=src python benchmarks/chat_batch.py --backbone {args.backbone} --records "
            f"{args.records} --batch-size {args.batch_size} --max-new-tokens {args.max_new_tokens}",
            "machine": machine(),
            "records": len(records),
            "steps": steps,
            "one_at_a_time_seconds": round(one_s, 2),
            "batched_seconds": round(many_s, 2),
            "speedup": round(one_s / many_s, 2),
            "dtype": str(model.backbone.model.dtype).removeprefix("torch."),
            "same_calls": one == many,
        },
    )
    print(
        f"{steps} steps: one at a time {one_s:.1f} s, batched {many_s:.1f} s ({one_s / many_s:.2f}×); same calls: {one == many}"
    )


if __name__ == "__main__":
    main()
