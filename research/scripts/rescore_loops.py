"""Stored tool-loop results scored again from their samples, by position (no answer is made again).

Each method's samples (per step and end to end, kept in every tool-loop result) are scored as the study now scores
them (``eval.tool_loop.scored_samples``: each answer against its own step's gold call, the pooled F1 beside, the per-step
outcomes); the gold steps' tool results, which older samples did not keep, are taken from the study's test records,
rebuilt from its config (``loop_answers.study_data``).  The pooled F1 computed again must equal the stored one (a
check that the samples are those the scores came from); the pooled routing F1 is kept as stored (older samples did
not keep the memory tokens' choices, so routing by position is left out of them).  A file whose per-step samples
lack their no-call steps (written before they were kept in place) cannot be scored by position: it is left as it is
and named.  A combined file of several seeds (``"study": "repeats"``) is made again from its rescored runs.

    python -m research.scripts.rescore_loops results/loop-cfb-qwen0.5b.json results/loop-cfb-qwen0.5b-seeds.json …
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from research.scripts.loop_answers import study_data

from tokmem.io import write_json_atomic
from research.studies import compositional_report
from research.studies.compositional import SCORE_KEYS
from research.studies.harness import aggregate_seeds
from tokmem.eval.tool_loop import scored_samples

POOLED = ("tool_f1", "arg_f1", "call_f1")


class NotAligned(Exception):
    """A file whose per-step samples are shorter than their gold calls."""


def rescored_method(entry: dict, results: dict[str, list]) -> dict:
    """One method's entry with its scores made again from its samples (see the module docstring)."""
    samples = entry["samples"]
    if any(len(s["step"]) != len(s["gold"]) for s in samples):
        raise NotAligned(f"{sum(len(s['step']) != len(s['gold']) for s in samples)} records lack their no-call steps")
    samples = [s | {"results": s.get("results") or results[s["query"]]} for s in samples]
    memory = all("routes" in s for s in samples)
    scores = scored_samples(samples, memory)
    old_step = entry.get("step_pooled", entry["step"])
    for metric in POOLED:
        stored, again = old_step[metric]["avg"], scores["step_pooled"][metric]["avg"]
        if not math.isclose(stored, again, abs_tol=1e-6):
            raise ValueError(f"the samples' pooled {metric} is {again:.3f}, the file's {stored:.3f}")
    if "routing_f1" in old_step and not memory:
        scores["step_pooled"]["routing_f1"] = old_step["routing_f1"]
    return entry | scores | {"samples": samples}


def rescored_run(result: dict) -> dict:
    """A single run (``"study": "main"`` in the tool loop) with every method's scores made again."""
    examples = study_data(result["config"], None)[0]
    results = {query: [s.result for s in e.steps] for query, e in examples.items()}
    methods = {name: rescored_method(entry, results) for name, entry in result["methods"].items()}
    return result | {"methods": methods}


def rescored_repeats(result: dict) -> dict:
    """A combined file, its runs rescored in place and combined again (``harness.aggregate_seeds``)."""
    by_budget: dict[str, list[dict]] = {}
    for path in result["runs"]:
        run = rescored_run(json.loads(Path(path).read_text()))
        write_json_atomic(path, run)  # a run file is JSON alone
        by_budget.setdefault(str(run["config"]["epochs"]), []).append(run)
    budgets = {epochs: aggregate_seeds(runs, SCORE_KEYS) for epochs, runs in by_budget.items()}
    return result | {"epoch_budgets": budgets}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    for path in args.files:
        result = json.loads(Path(path).read_text())
        try:
            rescored = rescored_repeats(result) if result["study"] == "repeats" else rescored_run(result)
        except NotAligned as why:
            print(f"{path}: left as it is, not scored by position ({why})")
            continue
        compositional_report.write_outputs(rescored, path)
        print(f"{path}: rescored")


if __name__ == "__main__":
    main()
