"""The open set on a user's few tools (the travel example, smollm2-135m): how many off-topic queries a bank leaves to
the plain backbone, beside how many of its own queries it routes, per recipe.

* ``choose`` (the development split; every choice is made here): a bank learns the training queries but one fold
  of their phrasings (``travel_defaults.phrasing_split``: the in-domain validation asks in phrasings never trained on),
  with one recipe of ``VARIANTS`` (``tokmem train``'s defaults, or one lever changed: an A/B each), and routes the
  validation queries and two off-topic validation sets: the built-in general-chat prompts (``chat``) and BFCL's live
  irrelevance questions (``bfcl-live-irrelevance``).  Neither is trained on: the negatives are generated from other
  text (``tokmem.data.off_topic``).
* ``table`` (the test, read once for a recipe): ``tokmem train`` with no option but the seed learns the whole
  training data in float32 and bf16 (``$TOKMEM_CPU_BF16``), then routes the 40 held-out queries and the off-topic
  sets, BFCL's 240 irrelevance questions among them.
* ``unfiltered``: kept banks on all 240 of BFCL's irrelevance questions, none set apart for naming a tool's word.
* ``plot``: the threshold curve (in-domain routing against off-topic restraint as the open-set threshold moves)
  from the memory masses every run keeps.

A query sharing a word with a tool's name or description (``off_topic.mentions``) is not scored as off-topic.
Resumable: a run already in ``--json`` is not run again.

    python -m research.scripts.open_set choose --variants defaults,no-negatives --json results/open-set-travel-dev.json
    python -m research.scripts.open_set table --seeds 0,1,2 --json results/open-set-travel.json
    python -m research.scripts.open_set table --seeds 0,1,2 --tools research/data/assistant \
        --json results/open-set-assistant.json   # the tool set kept apart, read once
    python -m research.scripts.open_set plot --json results/open-set-travel.json --dev results/open-set-travel-dev.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import torch
from research.scripts.travel_defaults import TRAVEL, learned, phrasing_split

import tokmem
from tokmem.backbones import CPU_BF16, DEFAULT_BACKBONE, cpu_dtype_note, load_backbone
from tokmem.cli import main as main_cli
from tokmem.data import load_examples
from tokmem.decoding.decode import open_set_threshold, route
from tokmem.eval.open_set import off_topic_queries, restraint
from tokmem.io import write_json_atomic
from tokmem.report import machine
from tokmem.training.train import PICKED_RECIPE

VARIANTS = {  # tokmem train's defaults and one lever each (the options picked_config takes, and decoupled)
    "defaults": {},
    "no-negatives": {"negatives": 0.0},
    "negatives-0.5": {"negatives": 0.5},
    "negatives-1": {"negatives": 1.0},
    "negatives-2": {"negatives": 2.0},
    "near-misses": {"near_misses": True},
    "near-misses-2": {"negatives": 2.0, "near_misses": True},
    "no-negatives-no-refit": {"negatives": 0.0, "refit_index": False},
    "no-negatives-tied": {"negatives": 0.0, "refit_index": False, "decoupled": False},
    "no-negatives-half-budget": {"negatives": 0.0, "updates_per_row": 25},
    "tied": {"refit_index": False, "decoupled": False},
}
DEV_SETS, TEST_SETS = ("chat", "bfcl-live-irrelevance"), ("chat", "bfcl-irrelevance", "bfcl-live-irrelevance")
THRESHOLDS = [round(0.05 * k, 2) for k in range(1, 20)]


def routed(model, examples) -> dict:
    """The in-domain queries' memory masses and whether each one's top procedure is its first gold step's."""
    routes = route(model, [e.query for e in examples], k=1)
    right = [r.candidates[0][0] == e.procedures[0] for r, e in zip(routes, examples)]
    return {"masses": [round(r.memory_mass, 4) for r in routes], "right": right}


def scores(model, in_domain, sets) -> dict:
    """In-domain routing (at the default threshold, and the masses) and each off-topic set's restraint."""
    found = routed(model, in_domain)
    threshold = open_set_threshold(model.bank)
    share = sum(r and m >= threshold for r, m in zip(found["right"], found["masses"])) / len(in_domain)
    off = {name: restraint(model, off_topic_queries(name), threshold) for name in sets}
    return {"threshold": threshold, "in_domain": found | {"routing": share}, "off_topic": off}


def choose_run(backbone, variant: str, seed: int, fold: int, folds: int) -> dict:
    train, validation = phrasing_split(load_examples(TRAVEL / "train.jsonl"), fold, folds)
    options = dict(VARIANTS[variant])
    model, run = learned(backbone, train, seed, options.pop("updates_per_row", None), **{"decoupled": True, **options})
    return run | {"options": VARIANTS[variant], "train_examples": len(train)} | scores(model, validation, DEV_SETS)


def table_run(dtype: str, seed: int, folder: Path, tools: Path = TRAVEL) -> dict:
    """``tokmem train`` with no option but the seed, in ``dtype`` (as a user's CPU picks it), on the tool set in
    ``tools`` (its ``train.jsonl`` and ``catalog.json``), then the bank on its ``heldout.jsonl`` queries and the
    off-topic sets."""
    os.environ[CPU_BF16] = "1" if dtype == "bfloat16" else "0"
    bank, report = folder / f"{dtype}-seed{seed}.safetensors", folder / f"{dtype}-seed{seed}.json"
    flags = ["--data", str(tools / "train.jsonl"), "--catalog", str(tools / "catalog.json"), "--out", str(bank)]
    if main_cli(["train", *flags, "--seed", str(seed), "--json", str(report), "--off-topic", "none", "--quiet"]):
        raise RuntimeError(f"tokmem train failed: {flags}")
    train = json.loads(report.read_text())["train"]
    model = tokmem.load(bank, device="cpu")
    run = {"dtype": str(model.backbone.model.dtype).removeprefix("torch."), "updates": train["steps"]}
    run |= {"train_seconds": train["seconds"], "negatives": train["negatives"]}
    return run | scores(model, load_examples(tools / "heldout.jsonl"), TEST_SETS)


def unfiltered(bank: str, name: str = "bfcl-irrelevance") -> dict:
    """A kept bank on every question of an off-topic set, none set apart for naming the bank's words: how many it
    answers in words, and the ones it routes; in the dtype its file name says (``table_run`` names them so)."""
    os.environ[CPU_BF16] = "0" if "float32" in Path(bank).name else "1"
    model = tokmem.load(bank, device="cpu")
    threshold, queries = open_set_threshold(model.bank), off_topic_queries(name)
    routes = [r for r in route(model, queries, k=1) if r.memory_mass >= threshold]
    routed = [
        {"query": r.query, "procedure": r.candidates[0][0], "memory_mass": round(r.memory_mass, 3)} for r in routes
    ]
    return {"bank": Path(bank).name, "set": name, "threshold": threshold, "questions": len(queries)} | {
        "answered_in_words": len(queries) - len(routed),
        "routed": routed,
    }


def curve(run: dict, name: str) -> list[dict]:
    """Per threshold: the in-domain routing and the restraint on the off-topic set ``name``."""
    found, masses = run["in_domain"], run["off_topic"][name]["masses"]
    return [
        {
            "threshold": t,
            "routing": sum(r and m >= t for r, m in zip(found["right"], found["masses"])) / len(found["masses"]),
            "restraint": sum(m < t for m in masses) / len(masses),
        }
        for t in THRESHOLDS
    ]


def plot(result: dict, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {f"table: {key}": run for key, run in result.get("table", {}).items() if key != "recipe"}
    runs |= {f"dev: {key}": run for key, run in result.get("choose", {}).items() if key != "protocol"}
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    for axis, name in zip(axes, ("bfcl-irrelevance", "chat")):
        for label, run in runs.items():
            if name in run["off_topic"]:
                points = curve(run, name)
                axis.plot([p["restraint"] for p in points], [p["routing"] for p in points], marker=".", label=label)
        axis.set(title=f"off-topic: {name}", xlabel="off-topic answered in words", xlim=(0, 1.02), ylim=(0, 1.02))
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("in-domain queries routed right")
    axes[1].legend(fontsize=6, loc="lower left")
    figure.tight_layout()
    figure.savefig(out, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=("choose", "table", "plot", "unfiltered"))
    parser.add_argument("--banks", nargs="*", default=[], help="unfiltered: kept banks (the table's are in a temp dir)")
    parser.add_argument("--variants", default="defaults", help=f"choose: of {', '.join(VARIANTS)}")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="table: the backbone's dtypes")
    parser.add_argument("--seeds", default="0")
    parser.add_argument(
        "--tools", type=Path, default=TRAVEL, help="table: the tool set's folder (default the travel example)"
    )
    parser.add_argument("--fold", type=int, default=0)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--json", default="results/open-set-travel.json")
    parser.add_argument("--out", default="docs/open-set-travel.png", help="plot: the figure")
    parser.add_argument("--dev", help="plot: also the choose runs of this file (when --json holds the table)")
    args = parser.parse_args()
    path = Path(args.json)
    result = json.loads(path.read_text()) if path.is_file() else {}
    if args.stage == "unfiltered":
        return write_json_atomic(path, {"runs": [unfiltered(bank) for bank in args.banks], "machine": machine()})
    if args.stage == "plot":
        dev = json.loads(Path(args.dev).read_text()) if args.dev else {}
        return plot(result | {"choose": dev.get("choose", result.get("choose", {}))}, args.out)
    result.setdefault("machine", machine() | {"cpu_dtype": cpu_dtype_note()})
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.stage == "choose":
        backbone = load_backbone(DEFAULT_BACKBONE, device="cpu", dtype=torch.bfloat16)
        protocol = f"bfloat16; in-domain validation: phrasing fold {args.fold} of {args.folds}; off-topic: {DEV_SETS}"
        runs = result.setdefault("choose", {"protocol": protocol})
        for variant in args.variants.split(","):
            for seed in seeds:
                key = f"{variant}, seed {seed}"
                if key not in runs:
                    runs[key] = choose_run(backbone, variant, seed, args.fold, args.folds)
                    write_json_atomic(path, result)
                print(key, summary(runs[key]), flush=True)
        return
    runs = result.setdefault("table", {"recipe": PICKED_RECIPE, "tools": str(args.tools)})
    folder = Path(tempfile.mkdtemp(prefix="open-set-"))
    for dtype in args.dtypes.split(","):
        for seed in seeds:
            key = f"{dtype}, seed {seed}"
            if key not in runs:
                runs[key] = table_run(dtype, seed, folder, args.tools)
                write_json_atomic(path, result)
            print(key, summary(runs[key]), flush=True)


def summary(run: dict) -> str:
    off = ", ".join(
        f"{name} {found['answered_in_words']}/{found['scored']}" for name, found in run["off_topic"].items()
    )
    return f"in-domain routing {run['in_domain']['routing']:.3f}; off-topic answered in words: {off}"


if __name__ == "__main__":
    main()
