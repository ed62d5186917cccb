"""The key order a tool's arguments are trained and decoded in: the training calls' order (what ``tokmem.learn``
keeps, ``--key-order calls``) against the order the tool's schema lists (``schema``, what it kept before), two TokMem
banks trained for the ComplexFuncBench tool loop, each trained and decoded in its own order.

The grammar writes an object's keys in its schema's order, and ComplexFuncBench's spec lists some tools' keys in an
order their calls never use (``Search_Car_Rentals``: ``pick_up_longitude``, ``drop_off_time``, ``drop_off_latitude``,
…).  Each bank is trained as the tool-loop study trains TokMem (w/o adapt) (``--preset cpu --dataset
complexfuncbench``, the seed given; the key order the one difference), then answers the study's test records per
step; each row has the per-step scores by position (``eval.steps``), the outcomes, and the outcomes of the tools the
two orders differ on counted apart.  Each bank is kept beside the results (``<json stem>-banks/<order>.safetensors``)
to answer again without training.  Resumable: an order answered in ``--json`` is not run again; an order trained
(its updates and seconds in ``--json``, its bank kept) is answered without training again.

    OMP_NUM_THREADS=2 python benchmarks/schema_order.py --seed 0 --backbone qwen2.5-coder-0.5b \
        --json results/schema_order-qwen0.5b.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

import torch

from loop_answers import reordered_tools  # a script beside this one (its folder is on the path when run)

from tokmem.bank import MemoryBank
from tokmem.eval.steps import OUTCOMES, aligned_scores, outcome, outcomes
from tokmem.model import TokMemModel
from tokmem.io import write_json_atomic
from tokmem.report import machine
from tokmem.sequences import RESULT_TOKENS
from tokmem.studies.compositional_config import make_config
from tokmem.studies.harness import learn_round, progress_bar
from tokmem.studies.tool_setup import build_method, prepare_backbones, tool_data
from tokmem.studies.tool_loop import step_predictions
from tokmem.train import KEY_ORDERS
from tokmem.cli.options import add_backbone


def per_step(method, data, reordered: set[str], bar) -> dict:
    """Per step, by position: the scores, the outcomes, and the outcomes of the ``reordered`` tools' steps apart."""
    bar.phase(f"answering {len(data.test)} records step by step", len(data.test))
    start = time.perf_counter()
    steps, routes, _ = step_predictions(method, data.test, RESULT_TOKENS, bar)
    samples = [
        {"query": e.query, "gold": [s.response for s in e.steps], "results": [s.result for s in e.steps], "step": p}
        for e, p in zip(data.test, steps)
    ]
    return {
        "step": aligned_scores([s["gold"] for s in samples], steps, routes),
        "outcomes": outcomes(samples),
        "outcomes of the reordered tools": group_outcomes(samples, reordered),
        "seconds": round(time.perf_counter() - start, 1),
        "samples": [s | {"routes": r} for s, r in zip(samples, routes)],
    }


def group_outcomes(samples: list[dict], tools: set[str]) -> dict[str, int]:
    """The per-step outcomes (``steps.outcome``) of the steps whose gold call is one of ``tools``."""
    counted = Counter(
        outcome(gold, answer, s["gold"][:k])
        for s in samples
        for k, (gold, answer) in enumerate(zip(s["gold"], s["step"]))
        if json.loads(gold)["name"] in tools
    )
    return {kind: counted[kind] for kind in OUTCOMES}


def run_order(order: str, args, found: dict, save) -> dict:
    """One bank trained (unless ``found`` says it was and its bank is kept) and answered in ``order``
    (``TrainConfig.key_order``); ``save(entry)`` keeps the entry once trained."""
    config = make_config(
        "cpu",
        dataset="complexfuncbench",
        backbone=args.backbone,
        methods=("tokmem-noadapt",),
        seed=args.seed,
        key_order=order,
    )
    torch.manual_seed(config.seed)
    data = tool_data(config, (1, config.tools))
    backbones, _ = prepare_backbones(config, None, progress=True)
    method = build_method("tokmem-noadapt", config, backbones, data.tools)
    kept = Path(args.json).with_name(f"{Path(args.json).stem}-banks") / f"{order}.safetensors"
    if "train_seconds" in found and kept.is_file():
        backbone = method.model.backbone
        method.model = TokMemModel(backbone, MemoryBank.load(kept, backbone=backbone))
        entry = found
    else:
        seconds = learn_round(method, data.train, f"{len(data.train)} queries ({order} order)", args.bar)
        method.model.bank.save(kept)
        entry = {"updates": method.updates, "train_seconds": round(seconds, 1)}
        save(entry)
    reordered = reordered_tools(data.tools, data.train)
    return entry | {"tools_whose_order_differs": sorted(reordered), **per_step(method, data, reordered, args.bar)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    add_backbone(parser)
    parser.add_argument("--json", default="results/schema_order.json")
    args = parser.parse_args()
    path = Path(args.json)
    result = json.loads(path.read_text()) if path.is_file() else {}
    result |= {
        "command": f"python benchmarks/schema_order.py --seed {args.seed} --backbone {args.backbone}",
        "config": {"preset": "cpu", "dataset": "complexfuncbench", "method": "tokmem-noadapt", "seed": args.seed},
        "backbone": args.backbone,
        "machine": machine(),
    }
    args.bar = progress_bar(True)
    orders = result.setdefault("orders", {})
    for order in KEY_ORDERS:

        def save(entry: dict, order=order) -> None:
            orders[order] = entry
            write_json_atomic(path, result)

        if "step" not in orders.get(order, {}):
            save(run_order(order, args, orders.get(order, {}), save))
        found = orders[order]
        print(
            f"{order} order: exact steps {found['step']['exact_steps']['all']} of {found['step']['steps']['all']}, "
            f"call F1 {found['step']['call_f1']['all']:.1f}; reordered tools' outcomes "
            f"{found['outcomes of the reordered tools']}"
        )
    args.bar.close()


if __name__ == "__main__":
    main()
