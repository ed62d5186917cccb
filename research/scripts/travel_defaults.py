"""The default recipe of ``tokmem train`` on a user's few tools, chosen on a validation split and then measured on the
held-out queries, in float32 and bf16 (the travel example, ``examples/travel/``, on smollm2-135m).

* ``choose``: the training queries are split by phrasing: each tool's training templates
  (``examples/travel/make_data.py``) are dealt into ``--folds`` folds and the examples of one fold's templates are the
  validation split, so that it asks in phrasings the rest never trained on (as the held-out queries do).  For each
  budget (``--budgets``: updates a new tool) and seed, a bank learns the rest as ``tokmem train`` would with that
  budget (``train.picked_config``) and routes the validation queries (the open-set rule applies: a fallback to the
  plain backbone is a miss).  The budget the defaults take is chosen from these rows, never from the held-out queries.
* ``table``: ``tokmem train`` itself, with no option but ``--seed``, learns the whole training data in the dtype a CPU
  with (``bfloat16``) or without (``float32``) bf16 units picks (``$TOKMEM_CPU_BF16``); the bank answers the 40
  held-out queries (``tokmem eval``'s ``evaluate``: routing, fallbacks, calls per step by position), per dtype
  (``--dtypes``) and seed.

Resumable: a run already in ``--json`` is not run again.  Each run records its seconds, the machine records its CPU.

    OMP_NUM_THREADS=2 python -m research.scripts.travel_defaults choose --budgets 50,80 --seeds 0,1 --json results/travel-defaults.json
    OMP_NUM_THREADS=2 python -m research.scripts.travel_defaults table --dtypes float32,bfloat16 --seeds 0,1,2 --json results/travel-defaults.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

import tokmem
from tokmem.backbones import CPU_BF16, DEFAULT_BACKBONE, cpu_dtype_note, load_backbone
from tokmem.cli import main as main_cli
from tokmem.data import load_catalog, load_examples
from tokmem.data.procedures import load_schemas
from tokmem.decoding.decode import DecodeConfig
from tokmem.eval.evaluate import evaluate
from tokmem.io import write_json_atomic
from tokmem.report import machine
from tokmem.training.train import PICKED_RECIPE, UPDATES_PER_ROW, picked_config

TRAVEL = Path(__file__).resolve().parents[2] / "examples" / "travel"


def make_data():
    """``examples/travel/make_data.py``, whose templates made the training queries."""
    spec = importlib.util.spec_from_file_location("travel_make_data", TRAVEL / "make_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def template_of(query: str, templates: list[str]) -> int | None:
    """The index of the template ``query`` was formatted from (its fields matched as any text; of several that
    match, the one with the most literal text: "weather check {city}" before "weather {city}")."""
    matches = [
        (len(re.sub(r"\{\w+\}", "", template)), k)
        for k, template in enumerate(templates)
        if re.fullmatch(re.sub(r"\\\{\w+\\\}", "(.+?)", re.escape(template)), query)
    ]
    return max(matches)[1] if matches else None


def phrasing_split(examples, fold: int, folds: int) -> tuple[list, list]:
    """(train, validation): the examples whose template is dealt to ``fold`` (every ``folds``-th template of each
    tool's list) are the validation split.  An example no template formed is an error (the data changed)."""
    data = make_data()
    lists = [data.WEATHER, data.CURRENCY, data.FLIGHTS, data.PRICED]
    train, validation = [], []
    for example in examples:
        found = [
            (n, k) for n, templates in enumerate(lists) if (k := template_of(example.query, templates)) is not None
        ]
        if not found:
            raise ValueError(f"{example.id}: no template of make_data.py formed {example.query!r}")
        (validation if found[0][1] % folds == fold else train).append(example)
    return train, validation


def learned(backbone, examples, seed: int, updates_per_row: int | None = None, decoupled: bool = False, **options):
    """A bank ``tokmem train`` makes of ``examples`` with no option given (``picked_config``), or with the budget of
    ``updates_per_row`` updates a new tool, ``decoupled`` rows and the ``options`` given (batch size, lr); and its
    training seconds."""
    model = tokmem.create(backbone, decoupled=decoupled)
    rows = len({p for e in examples for p in e.procedures})
    config = picked_config(examples, rows, seed=seed, progress=False, **options)
    if updates_per_row is not None:
        steps_per_epoch = -(-len(examples) // config.batch_size)
        config = replace(config, epochs=-(-updates_per_row * rows // steps_per_epoch))
    catalog = TRAVEL / "catalog.json"
    start = time.perf_counter()
    report = tokmem.learn(model, examples, config, load_catalog(catalog), schemas=load_schemas(catalog))
    return model, {
        "epochs": config.epochs,
        "updates": report.steps,
        "train_seconds": round(time.perf_counter() - start),
    }


def choose_run(backbone, budget: int, options: dict, seed: int, fold: int, folds: int) -> dict:
    train, validation = phrasing_split(load_examples(TRAVEL / "train.jsonl"), fold, folds)
    model, run = learned(backbone, train, seed, budget, **options)
    scores = evaluate(model, validation, DecodeConfig(), loop=False)
    return run | {
        "train_examples": len(train),
        "validation_examples": len(validation),
        "validation_routing": scores["routing_accuracy"],
        "validation_fallbacks": scores["open_set_fallbacks"],
    }


def table_run(dtype: str, seed: int, folder: Path) -> dict:
    """``tokmem train`` with no option but the seed, in ``dtype`` (``$TOKMEM_CPU_BF16``, as a user's CPU picks it),
    then the bank on the held-out queries (``tokmem eval``'s ``evaluate``)."""
    os.environ[CPU_BF16] = "1" if dtype == "bfloat16" else "0"
    bank, report = folder / f"{dtype}-seed{seed}.safetensors", folder / f"{dtype}-seed{seed}.json"
    catalog, data = TRAVEL / "catalog.json", TRAVEL / "train.jsonl"
    flags = [
        "--data",
        str(data),
        "--catalog",
        str(catalog),
        "--out",
        str(bank),
        "--seed",
        str(seed),
        "--json",
        str(report),
    ]
    if main_cli(["train", *flags, "--quiet"]) != 0:
        raise RuntimeError(f"tokmem train failed: {flags}")
    train = json.loads(report.read_text())["train"]
    model = tokmem.load(bank, device="cpu")
    scores = evaluate(model, load_examples(TRAVEL / "heldout.jsonl"), DecodeConfig())
    misses = [p for p in scores["predictions"] if not p["routed_right"]]
    return {
        "decoupled": model.bank.decoupled,
        "dtype": str(model.backbone.model.dtype).removeprefix("torch."),
        "updates": train["steps"],
        "train_seconds": train["seconds"],
        "refit": train.get("refit"),  # the routing side refit's counts (``train.PICKED_RECIPE``), None without it
        "heldout_routing": scores["routing_accuracy"],
        "heldout_fallbacks": scores["open_set_fallbacks"],
        "calls_per_step": scores["calls_per_step"],
        "step_outcomes": scores["step_outcomes"],
        "misses": [{"query": p["query"], "gold": p["gold"], "predicted": p["predicted"]} for p in misses],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=("choose", "table"))
    parser.add_argument(
        "--budgets",
        default="50,80",
        help="choose: updates a new tool[:batch size[:lr[:dc]]], e.g. 50,80:2,50::1e-2,50:::dc; one run a seed each",
    )
    parser.add_argument("--dtypes", default="float32,bfloat16", help="table: the backbone's dtypes")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--fold", type=int, default=0)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--json", default="results/travel-defaults.json")
    args = parser.parse_args()
    path = Path(args.json)
    result = json.loads(path.read_text()) if path.is_file() else {}
    result.setdefault("machine", machine() | {"cpu_dtype": cpu_dtype_note()})
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.stage == "choose":
        backbone = load_backbone(DEFAULT_BACKBONE, device="cpu", dtype=torch.float32)
        runs = result.setdefault(
            "choose", {"protocol": f"float32; validation: template fold {args.fold} of {args.folds}"}
        )
        for candidate in args.budgets.split(","):
            budget, *rest = candidate.split(":")
            kinds = (("batch_size", int), ("lr", float), ("decoupled", lambda v: v == "dc"))
            options = {k: f(v) for (k, f), v in zip(kinds, rest) if v}
            named = {"batch_size": "batch", "lr": "lr", "decoupled": "decoupled"}
            for seed in seeds:
                key = ", ".join(
                    [
                        f"{budget} updates a tool",
                        *(f"{named[k]} {v:g}" if k != "decoupled" else named[k] for k, v in options.items()),
                    ]
                )
                key += f", seed {seed}"
                if key not in runs:
                    runs[key] = choose_run(backbone, int(budget), options, seed, args.fold, args.folds)
                    write_json_atomic(path, result)
                print(key, json.dumps(runs[key]))
        return
    runs = result.setdefault("table", {"updates_per_row": UPDATES_PER_ROW, "recipe": PICKED_RECIPE})
    folder = Path(tempfile.mkdtemp(prefix="travel-defaults-"))
    for dtype in args.dtypes.split(","):
        for seed in seeds:
            key = f"{dtype}, seed {seed}"
            if key not in runs:
                runs[key] = table_run(dtype, seed, folder)
                write_json_atomic(path, result)
            found = runs[key]
            print(key, f"routing {found['heldout_routing']:.3f}, fallbacks {found['heldout_fallbacks']}")


if __name__ == "__main__":
    main()
