"""What TokMem's routing on ComplexFuncBench needs: first-call routing against updates, by learning-rate recipe.

In the tool-loop study (120 updates, constant lr 5e-3) TokMem's memory tokens collapse onto a few tools.  This
isolates routing: TokMem learns every training record's query and first call only (no results in context, so a step
is ~100 tokens instead of ~1,330), and after every ``--evaluate-every`` updates of one run routes the test records'
queries (``tokmem.route``, the top memory token).  One run per recipe (learning-rate schedule and rate) and seed.
With a constant rate a point of the run is what a run stopped there would give; with the linear schedule (warm-up,
decay to 0 at the run's end) only the last point is a finished run.  Every point is taken before the round's final
renormalisation.  ``predicted`` counts how often each tool was chosen, against ``gold_first_calls``.

    python -m research.scripts.routing_budget --recipes constant:5e-3,linear:2e-2 --seeds 0,1,2 \
        --json results/routing_budget.json [--resume]
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from dataclasses import replace

import tokmem
from research.studies.realtools import complexfuncbench_data, function_calling_dir
from tokmem.errors import TokMemError
from tokmem.report import machine, write_json
from research.studies.harness import resumed, seed_spread
from tokmem.cli.options import add_backbone


def first_calls(examples):
    """Each record as its query and first call, without the call's result."""
    return [replace(e, steps=(replace(e.steps[0], result=None),)) for e in examples]


def routing(model, test) -> dict:
    """Top-1 first-call routing over ``test``: accuracy (0–100) and how often each tool was chosen."""
    routes = tokmem.route(model, [e.query for e in test], k=1)
    right = sum(r.best == e.procedures[0] for r, e in zip(routes, test))
    return {"accuracy": 100 * right / len(test), "predicted": dict(Counter(r.best for r in routes).most_common())}


def majority_accuracy(train, test) -> float:
    """The routing accuracy (0–100) of always choosing the tool most training records call first."""
    majority = Counter(e.procedures[0] for e in train).most_common(1)[0][0]
    return 100 * sum(e.procedures[0] == majority for e in test) / len(test)


def run(args, recipe: str, seed: int, train, test) -> dict:
    """One TokMem run: routing at every ``evaluate_every`` updates (and the last)."""
    model = tokmem.create(args.backbone, device="cpu")
    schedule, lr = recipe.split(":")
    config = tokmem.TrainConfig(
        lr=float(lr), epochs=args.epochs, batch_size=args.batch_size, seed=seed, schedule=schedule, progress=False
    )
    curve: dict[str, dict] = {}

    def evaluate(step: int, total: int) -> None:
        if step % args.evaluate_every == 0 or step == total:
            curve[str(step)] = routing(model, test)
            print(
                f"{recipe}, seed {seed}, {step:4d} updates: first-call routing {curve[str(step)]['accuracy']:.1f}",
                flush=True,
            )

    start = time.perf_counter()
    tokmem.learn(model, train, config, on_step=evaluate)
    return {"recipe": recipe, "seed": seed, "curve": curve, "seconds": round(time.perf_counter() - start, 1)}


def curve_over_seeds(runs: list[dict]) -> dict:
    """Per point of the curve: the accuracy over the seeds (``seed_spread``, as every study reports it)."""
    return {p: seed_spread([r["curve"][p]["accuracy"] for r in runs]) for p in runs[0]["curve"]}


SAME_RUNS = ("backbone", "epochs", "batch_size", "train_records", "evaluate_every")  # what a resumed file must share


def finished_runs(args) -> list[dict]:
    """With ``--resume``, the runs already saved in ``--json`` (made with the same settings: ``harness.resumed``),
    else none."""
    try:
        saved = resumed(args.json if args.resume else None, "routing_budget", {k: getattr(args, k) for k in SAME_RUNS})
    except TokMemError as err:
        raise SystemExit(str(err)) from None
    return saved["runs"] if saved else []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_backbone(parser)
    parser.add_argument(
        "--recipes",
        default="constant:5e-3,linear:2e-2",
        help="SCHEDULE:LR pairs, one run each: the tool-loop preset's (constant, 5e-3) and a decaying, faster one",
    )
    parser.add_argument("--seeds", default="0,1,2", help="one run per seed")
    parser.add_argument("--epochs", type=int, default=2, help="the tool-loop preset's")
    parser.add_argument("--batch-size", type=int, default=2, help="the tool-loop preset's")
    parser.add_argument(
        "--train-records", type=int, default=None, help="the first N training records (default: all 233)"
    )
    parser.add_argument("--evaluate-every", type=int, default=58, help="updates between two routing measurements")
    parser.add_argument("--json", default="results/routing_budget.json")
    parser.add_argument("--resume", action="store_true", help="keep the runs --json already has; run the others")
    args = parser.parse_args()
    data = complexfuncbench_data(function_calling_dir(None), train_size=args.train_records, test_size=None)
    train, test = first_calls(data.data.train), data.data.test
    recipes = args.recipes.split(",")
    runs = finished_runs(args)
    for seed in args.seeds.split(","):  # seed by seed, every recipe: a stopped benchmark keeps its finished runs
        for recipe in recipes:
            if any(r["recipe"] == recipe and r["seed"] == int(seed) for r in runs):
                continue
            runs.append(run(args, recipe, int(seed), train, test))
            write_json(args.json, result(args, train, test, runs))
    for recipe, curve in result(args, train, test, runs)["first_call_routing"].items():
        for p, a in curve.items():
            print(f"{recipe:>14}, {p:>5} updates: first-call routing {a['avg']:.1f} ± {a['sd']:.1f} ({a['per_seed']})")


def result(args, train, test, runs: list[dict]) -> dict:
    """The benchmark's JSON over the finished runs."""
    recipes = dict.fromkeys(r["recipe"] for r in runs)
    return {
        "study": "routing_budget",
        "config": vars(args),
        "machine": machine(),
        "data": {
            "source": "ComplexFuncBench records with 2–4 calls, the tool-loop study's query-hash split; first calls",
            "train": len(train),
            "test": len(test),
            "gold_first_calls": dict(Counter(e.procedures[0] for e in test).most_common()),
        },
        "majority_accuracy": round(majority_accuracy(train, test), 1),
        "first_call_routing": {r: curve_over_seeds([x for x in runs if x["recipe"] == r]) for r in recipes},
        "runs": runs,
    }


if __name__ == "__main__":
    main()
