"""The key order a tool's arguments decode in: the training calls' order (what ``tokmem.learn`` keeps) against the
order the tool's schema lists (what it kept before), on one TokMem bank trained for the ComplexFuncBench tool loop.

The grammar writes an object's keys in its schema's order, and ComplexFuncBench's spec lists some tools' keys in an
order their calls never use (``Search_Car_Rentals``: ``pick_up_longitude``, ``drop_off_time``, ``drop_off_latitude``,
…). One bank is trained as the tool-loop study trains TokMem (w/o adapt) (``--preset cpu --dataset
complexfuncbench``, the seed given), then answers the study's test records per step twice, the bank's schemas in the
calls' order and then in the spec's (their learned bounds kept): the one difference between the two rows.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/schema_order.py --seed 0 --json results/schema_order.json
"""

from __future__ import annotations

import argparse
import time

import torch

from tokmem.io import write_json_atomic
from tokmem.report import machine
from tokmem.studies.compositional import learn_and_evaluate, scores_of
from tokmem.studies.compositional_config import make_config
from tokmem.studies.harness import progress_bar
from tokmem.studies.tool_setup import build_method, prepare_backbones, tool_data

KEPT = ("tool_f1", "arg_f1", "call_f1", "routing_f1")


def in_spec_order(bank, spec: dict[str, dict]) -> None:
    """Each tool row's schema with its properties back in the order of the tool's ``spec`` (bounds unchanged)."""
    for row, (name, schema) in enumerate(zip(bank.names, bank.schemas)):
        if schema is not None and name in spec:
            listed = spec[name]["parameters"]["properties"]
            bank.schemas[row] = {**schema, "properties": {key: schema["properties"][key] for key in listed}}


def summary(scores: dict) -> dict:
    return {
        "step": {k: scores["step"][k] for k in KEPT if k in scores["step"]},
        "end_to_end": {k: scores["end_to_end"][k] for k in KEPT if k in scores["end_to_end"]},
        "eval_seconds": scores.get("eval_seconds"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backbone", default="smollm2-135m")
    parser.add_argument("--json", default="results/schema_order.json")
    args = parser.parse_args()
    config = make_config(
        "cpu", dataset="complexfuncbench", backbone=args.backbone, methods=("tokmem-noadapt",), seed=args.seed
    )
    torch.manual_seed(config.seed)
    data = tool_data(config, (1, config.tools))
    backbones, _ = prepare_backbones(config, None, progress=True)
    method = build_method("tokmem-noadapt", config, backbones, data.tools)
    bar = progress_bar(True)
    start = time.perf_counter()
    calls_order = learn_and_evaluate(method, data, config, bar)
    reordered = [
        name
        for name, schema in zip(method.model.bank.names, method.model.bank.schemas)
        if schema and list(schema["properties"]) != list(data.tools[name]["parameters"]["properties"])
    ]
    in_spec_order(method.model.bank, data.tools)
    spec_order = scores_of(method, data, config, bar)
    bar.close()
    result = {
        "command": f"python benchmarks/schema_order.py --seed {args.seed} --backbone {args.backbone}",
        "config": {"preset": "cpu", "dataset": "complexfuncbench", "method": "tokmem-noadapt", "seed": config.seed},
        "machine": machine(),
        "updates": calls_order.get("updates"),
        "train_seconds": calls_order.get("train_seconds"),
        "tools_whose_order_differs": reordered,
        "calls_order": summary(calls_order),
        "spec_order": summary(spec_order),
        "seconds": round(time.perf_counter() - start, 1),
    }
    write_json_atomic(args.json, result)
    for label in ("calls_order", "spec_order"):
        print(label, result[label]["step"])


if __name__ == "__main__":
    main()
