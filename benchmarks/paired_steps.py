"""Two methods' per-step tool-loop answers set side by side, step by step: which steps each gets right.

A difference of a few exact steps out of 80 between two methods is read from their totals alone as if the steps were
independent draws; they are the same steps.  This pairs the answers of two runs of one split and seed (the same
test records, by query) and counts each step by both outcomes (`tokmem.eval.steps.outcome`): the steps both get
exact, those only one gets, and what the other got wrong there.  The exact McNemar test on the steps only one gets
exact says how likely a split that uneven would be if neither method were better on these steps.

Each side is ``FILE:NAME``: a study's result file and a method (``methods``), a ``loop_ab.py`` file and a variant
(``variants``), or a ``reanswer_loop.py`` file and a rule (``rules``); ``FILE`` alone when it holds one.

Several pairs (one a seed: ``A0 B0 A1 B1 ...``) are counted each and then pooled: every step of every seed is a pair
of answers to one gold call, so the pooled McNemar test says whether the first method is ahead over the seeds
together, where one seed's 80 steps rarely can.

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
    return counts(outcome_pairs(first, second))


def outcome_pairs(first: list[dict], second: list[dict]) -> Counter:
    """(the first run's outcome, the second's) → steps, over the records both runs answered."""
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
    return pairs


def counts(pairs: Counter) -> dict:
    """The exact steps split four ways, the McNemar p-value and every pair of outcomes, from ``outcome_pairs``."""
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


def pooled(runs: list[tuple[list[dict], list[dict]]]) -> dict:
    """Each pair of runs counted (``paired``), and all their steps counted together."""
    each = [outcome_pairs(first, second) for first, second in runs]
    return {"pairs": [counts(pairs) for pairs in each], "pooled": counts(sum(each, Counter()))}


def table(counted: dict, first: str, second: str) -> str:
    """The pairs of outcomes as a markdown table: the first run's outcome a row, the second's a column."""
    pairs = counted["outcomes (first, second)"]
    seen = [o for o in OUTCOMES if any(key.startswith(f"{o} / ") or key.endswith(f" / {o}") for key in pairs)]
    lines = [f"| {first} ↓ / {second} → | " + " | ".join(seen) + " |", "|---" * (len(seen) + 1) + "|"]
    lines += [f"| {a} | " + " | ".join(str(pairs.get(f"{a} / {b}", 0)) for b in seen) + " |" for a in seen]
    return "\n".join(lines)


def line(counted: dict, first: str, second: str) -> str:
    return (
        f"exact: both {counted['both exact']}, only {first} {counted['only the first exact']}, "
        f"only {second} {counted['only the second exact']}, neither {counted['neither exact']} "
        f"of {counted['steps']} steps; McNemar p = {counted['mcnemar p']:.3g}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="FILE[:NAME]", help="the first and second run of each pair, in turn")
    parser.add_argument("--json", help="also write the counts here")
    args = parser.parse_args()
    if len(args.runs) % 2:
        parser.error(f"runs come in pairs (first, second), got {len(args.runs)}")
    names = list(zip(args.runs[::2], args.runs[1::2]))
    if len(names) == 1:
        counted = paired(answers(names[0][0]), answers(names[0][1]))
        print(table(counted, *names[0]) + "\n\n" + line(counted, *names[0]))
        written = {"first": names[0][0], "second": names[0][1], **counted}
    else:
        result = pooled([(answers(first), answers(second)) for first, second in names])
        for (first, second), counted in zip(names, result["pairs"]):
            print(line(counted, first, second))
        print(
            "\n"
            + table(result["pooled"], "first", "second")
            + "\n\npooled "
            + line(result["pooled"], "first", "second")
        )
        written = {
            "pairs": [{"first": a, "second": b, **c} for (a, b), c in zip(names, result["pairs"])],
            "pooled": result["pooled"],
        }
    if args.json:
        write_json_atomic(args.json, written)


if __name__ == "__main__":
    main()
