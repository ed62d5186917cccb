"""The key order a tool's arguments decode in: the training calls' order (what ``tokmem.learn`` keeps) against the
order the tool's schema lists (what it kept before), on one TokMem bank trained for the ComplexFuncBench tool loop.

The grammar writes an object's keys in its schema's order, and ComplexFuncBench's spec lists some tools' keys in an
order their calls never use (``Search_Car_Rentals``: ``pick_up_longitude``, ``drop_off_time``, ``drop_off_latitude``,
…). One bank is trained as the tool-loop study trains TokMem (w/o adapt) (``--preset cpu --dataset
complexfuncbench``, the seed given), then answers the study's test records per step twice, the bank's schemas in the
calls' order and then in the spec's (their learned bounds kept): the one difference between the two rows.  Each row
has the study's per-step scores and the exact steps (answer equal to that step's gold call) counted apart for the
tools the two orders differ on.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/schema_order.py --seed 0 --json results/schema_order.json
"""

from __future__ import annotations

import argparse
import time

import torch

from loop_answers import reordered_tools  # a script beside this one (its folder is on the path when run)

from tokmem.eval.evaluate import score_calls
from tokmem.eval.metrics import read_call
from tokmem.io import write_json_atomic
from tokmem.report import machine
from tokmem.sequences import RESULT_TOKENS
from tokmem.studies.compositional_config import make_config
from tokmem.studies.harness import learn_round, progress_bar
from tokmem.studies.tool_loop import made, step_predictions
from tokmem.studies.tool_setup import build_method, prepare_backbones, tool_data


def in_spec_order(bank, spec: dict[str, dict]) -> None:
    """Each tool row's schema with its properties back in the order of the tool's ``spec`` (bounds unchanged)."""
    for row, (name, schema) in enumerate(zip(bank.names, bank.schemas)):
        if schema is not None and name in spec:
            listed = spec[name]["parameters"]["properties"]
            bank.schemas[row] = {**schema, "properties": {key: schema["properties"][key] for key in listed}}


def per_step(method, data, reordered: set[str], bar) -> dict:
    """The study's per-step scores (tool / argument / call / routing F1, averaged over the numbers of calls) and the
    exact steps, apart for the ``reordered`` tools' gold calls and the others."""
    bar.phase(f"answering {len(data.test)} records step by step", len(data.test))
    start = time.perf_counter()
    steps, routes, _ = step_predictions(method, data.test, RESULT_TOKENS, bar)
    scores = score_calls(data.test, [made(p) for p in steps], routes)
    exact = {"reordered tools": [0, 0], "other tools": [0, 0]}
    for example, answers in zip(data.test, steps):
        for step, answer in zip(example.steps, answers):
            gold = read_call(step.response)
            group = exact["reordered tools" if gold[0] in reordered else "other tools"]
            group[0] += answer is not None and read_call(answer) == gold
            group[1] += 1
    return {
        **{k: round(v["avg"], 1) for k, v in scores.items() if isinstance(v, dict) and "avg" in v},
        "exact steps": {group: f"{right} of {total}" for group, (right, total) in exact.items()},
        "seconds": round(time.perf_counter() - start, 1),
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
    train_seconds = learn_round(method, data.train, f"{len(data.train)} queries", bar)
    bank, reordered = method.model.bank, reordered_tools(data.tools, data.train)
    calls_order = per_step(method, data, reordered, bar)
    in_spec_order(bank, data.tools)
    spec_order = per_step(method, data, reordered, bar)
    bar.close()
    result = {
        "command": f"python benchmarks/schema_order.py --seed {args.seed} --backbone {args.backbone}",
        "config": {"preset": "cpu", "dataset": "complexfuncbench", "method": "tokmem-noadapt", "seed": config.seed},
        "backbone": args.backbone,
        "machine": machine(),
        "updates": method.updates,
        "train_seconds": round(train_seconds, 1),
        "tools_whose_order_differs": sorted(reordered),
        "per_step": {"calls' order": calls_order, "spec's order": spec_order},
    }
    write_json_atomic(args.json, result)
    for label, scores in result["per_step"].items():
        print(label, scores)


if __name__ == "__main__":
    main()
