"""Schema-bound against free argument decoding, on one TokMem bank trained on ComplexFuncBench (CPU-sized).

Trains one bank (smollm2-135m, tool rows with the data's schemas) on a seeded sample of the training split (query
hash, as the studies split), then answers the first test records twice: with the schemas binding the arguments and
with ``schema=False``.  Reports tool / argument / call F1 (the project's scoring) and how many predicted calls have
arguments that meet their tool's schema (a JSON object with only the schema's keys and all its required ones).

    python -m research.scripts.schema_decoding --train 120 --test 30 --json results/schema_decoding.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from dataclasses import asdict
from pathlib import Path

import torch

import tokmem
from tokmem.backbones import DEFAULT_BACKBONE
from tokmem.data.nestful import import_nestful
from research.studies.realtools import hash_split
from tokmem.eval.evaluate import evaluate
from tokmem.io import write_text_atomic

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "function-calling" / "complexfuncbench"


def meets_schema(text: str, schema: dict) -> bool:
    """Whether a predicted call's arguments are an object with only the schema's keys and all its required ones."""
    try:
        arguments = json.loads(text)["arguments"]
    except (ValueError, TypeError, KeyError):
        return False
    return isinstance(arguments, dict) and set(schema.get("required", [])) <= set(arguments) <= set(
        schema.get("properties", {})
    )


def answer(model, test, catalog, config) -> dict:
    start = time.perf_counter()
    result = evaluate(model, test, config)
    calls = [(segment, name) for row in result["predictions"] for name, segment in row["trace"] if name is not None]
    valid = sum(meets_schema(text, catalog[name]["parameters"]) for text, name in calls)
    return {
        "calls": result["calls"],
        "routing_accuracy": result["routing_accuracy"],
        "predicted_calls": len(calls),
        "calls_meeting_their_schema": valid,
        "seconds": round(time.perf_counter() - start, 1),
        "examples": [
            {"query": r["query"][:120], "reference": r["reference"], "answer": r["answer"]}
            for r in result["predictions"][:3]
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=120, help="training records (a seeded sample of the split)")
    parser.add_argument("--test", type=int, default=30, help="test records (the first in hash order)")
    parser.add_argument("--max-calls", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--json", default="results/schema_decoding.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    imported = import_nestful(DATA / "complexfuncbench-data.json.gz", results=False)
    records = [e for e in imported.examples if len(e.steps) <= args.max_calls]
    train, test = hash_split(records, 0.2)
    train, test = random.Random(0).sample(train, min(args.train, len(train))), test[: args.test]
    model = tokmem.create(DEFAULT_BACKBONE, device="cpu")
    schemas = {name: entry["parameters"] for name, entry in imported.catalog.items()}
    config = tokmem.TrainConfig(epochs=args.epochs, progress=False)
    start = time.perf_counter()
    report = tokmem.learn(model, train, config, schemas=schemas)
    trained_s = time.perf_counter() - start
    decode = tokmem.DecodeConfig(max_new_tokens=args.max_new_tokens, max_steps=args.max_calls, batch_size=10)
    result = {
        "command": f"python -m research.scripts.schema_decoding --train {args.train} --test {args.test} "
        f"--max-calls {args.max_calls} --epochs {args.epochs} --max-new-tokens {args.max_new_tokens}",
        "machine": f"{platform.platform()}, {os.cpu_count()} CPUs, 1 torch thread (shared with other work)",
        "backbone": DEFAULT_BACKBONE,
        "train_records": len(train),
        "test_records": len(test),
        "train": asdict(config),
        "train_steps": report.steps,
        "train_seconds": round(trained_s, 1),
        "final_loss": report.losses[-1],
        "schema_bound": answer(model, test, imported.catalog, decode),
        "free": answer(model, test, imported.catalog, tokmem.DecodeConfig(**{**asdict(decode), "schema": False})),
    }
    text = json.dumps(result, indent=2, ensure_ascii=False)
    write_text_atomic(args.json, text + "\n")
    print(text)


if __name__ == "__main__":
    main()
