"""Two methods' per-step tool-loop answers set side by side, step by step: which steps each gets right.

A difference of a few exact steps out of 80 between two methods is read from their totals alone as if the steps were
independent draws; they are the same steps.  This pairs the answers of two runs of one split and seed (the same
test records, by query) and counts each step by both outcomes (`tokmem.eval.steps.outcome`): the steps both get
exact, those only one gets, and what the other got wrong there.  The exact McNemar test on the steps only one gets
exact says how likely a split that uneven would be if neither method were better on these steps.

Each side is ``FILE:NAME``: a study's result file and a method (``methods``), a ``loop_ab.py`` file and a variant
(``variants``), or a ``reanswer_loop.py`` file and a rule (``rules``); ``FILE`` alone when it holds one.

    python benchmarks/paired_steps.py results/index-refit-answers-qwen0.5b.json \
        results/loop-cfb-qwen0.5b.json:lora --json results/paired-refit-lora-qwen0.5b.json
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from math import comb
from pathlib import Path

from tokmem.eval.steps import OUTCOMES, outcome
from tokmem.io import write_json_atomic

GROUPS = ("methods", "variants", "rules")  # where a study, a loop_ab.py and a reanswer_loop.py file keep answers


def answers(spec: str) -> list[dict]:
    """The samples (``{"query", "gold", "step"}``) of ``FILE:NAME`` (see the module docstring)."""
    path, _, name = spec.partition(":") if not Path(spec).is_file() else (spec, "", "")
    if not Path(path).is_file():
        raise SystemExit(f"{path}: no such result file")
    result = json.loads(Path(path).read_text())
    found = next((result[group] for group in GROUPS if group in result), None)
    if found is None:
        raise SystemExit(f"{path}: no answers (none of {', '.join(GROUPS)})")
    if not name and len(found) == 1:
        name = next(iter(found))
    if name not in found:
        raise SystemExit(f"{path}: name one of {', '.join(found)} after a colon (FILE:NAME), not {name!r}")
    return found[name]["samples"]


def mcnemar(only_first: int, only_second: int) -> float:
    """Exact two-sided McNemar p-value: the binomial chance of a split of the discordant steps at least this uneven."""
    n = only_first + only_second
    tail = sum(comb(n, k) for k in range(min(only_first, only_second) + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired(first: list[dict], second: list[dict]) -> dict:
    """Both runs' outcomes of each step, counted: every pair of outcomes, and the exact steps split four ways."""
    by_query = {sample["query"]: sample for sample in second}
    missing = [sample["query"] for sample in first if sample["query"] not in by_query]
    if missing or len(first) != len(second):
        raise SystemExit(f"the two runs answered different records ({len(first)} and {len(second)}; {missing[:1]})")
    pairs = Counter()
    for sample in first:
        other = by_query[sample["query"]]
        if other["gold"] != sample["gold"]:
            raise SystemExit(f"record {sample['query'][:60]!r}: the two runs hold different gold calls")
        for k, gold in enumerate(sample["gold"]):
            earlier = sample["gold"][:k]
            pairs[outcome(gold, sample["step"][k], earlier), outcome(gold, other["step"][k], earlier)] += 1
    only_first = sum(n for (a, b), n in pairs.items() if a == "exact" != b)
    only_second = sum(n for (a, b), n in pairs.items() if b == "exact" != a)
    return {
        "steps": sum(pairs.values()),
        "both exact": pairs["exact", "exact"],
        "only the first exact": only_first,
        "only the second exact": only_second,
        "neither exact": sum(n for (a, b), n in pairs.items() if "exact" not in (a, b)),
        "mcnemar p": mcnemar(only_first, only_second),
        "outcomes (first, second)": {f"{a} / {b}": pairs[a, b] for a in OUTCOMES for b in OUTCOMES if pairs[a, b]},
    }


def table(counted: dict, first: str, second: str) -> str:
    """The pairs of outcomes as a markdown table: the first run's outcome a row, the second's a column."""
    pairs = counted["outcomes (first, second)"]
    seen = [o for o in OUTCOMES if any(key.startswith(f"{o} / ") or key.endswith(f" / {o}") for key in pairs)]
    lines = [f"| {first} ↓ / {second} → | " + " | ".join(seen) + " |", "|---" * (len(seen) + 1) + "|"]
    lines += [f"| {a} | " + " | ".join(str(pairs.get(f"{a} / {b}", 0)) for b in seen) + " |" for a in seen]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", help="FILE[:NAME]")
    parser.add_argument("second", help="FILE[:NAME]")
    parser.add_argument("--json", help="also write the counts here")
    args = parser.parse_args()
    counted = paired(answers(args.first), answers(args.second))
    print(table(counted, args.first, args.second))
    print(
        f"\nexact: both {counted['both exact']}, only {args.first} {counted['only the first exact']}, "
        f"only {args.second} {counted['only the second exact']}, neither {counted['neither exact']} "
        f"of {counted['steps']} steps; McNemar p = {counted['mcnemar p']:.3g}"
    )
    if args.json:
        write_json_atomic(args.json, {"first": args.first, "second": args.second, **counted})


if __name__ == "__main__":
    main()
