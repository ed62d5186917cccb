"""Two methods' per-step tool-loop answers set side by side: which steps each gets right, and by how much one leads,
with intervals clustered by record.

A difference of a few exact steps between two methods is read from their totals as if the steps were independent
draws; they are not: the steps of one record (one ComplexFuncBench conversation) share its query, its tools and its
earlier results, and several seeds answer the same records again.  This pairs the answers of two runs of one split
and seed (the same records, by query) and counts each step by both outcomes (`tokmem.eval.steps.outcome`): the steps
both get exact, those only one gets, and what the other got wrong there.  Then, by record: each method's exact steps
(a seed's, averaged over the seeds record by record) with a bootstrap 95% interval resampling records, and the paired
difference (first minus second) with its bootstrap interval and the exact two-sided sign-flip p-value over records
(each record's difference kept or negated, every way).  A difference concentrated in a few records reads as the few
records it is.

Each side is ``FILE:NAME``: a study's result file and a method (``methods``), a ``loop_ab.py`` file and a variant
(``variants``), or a ``reanswer_loop.py`` file and a rule (``rules``); ``FILE`` alone when it holds one.  Several
pairs, one a seed (``A0 B0 A1 B1 ...``), must answer the same records: each record's exact steps are averaged over
the seeds, never counted as new records.

    python -m research.scripts.paired_steps results/index-refit-answers-qwen0.5b.json \
        results/loop-cfb-qwen0.5b.json:lora --json results/paired-refit-lora-qwen0.5b.json
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import numpy as np

from research.results import read_result
from tokmem.eval.steps import OUTCOMES, outcome
from tokmem.io import write_json_atomic

GROUPS = ("methods", "variants", "rules")  # where a study, a loop_ab.py and a reanswer_loop.py file keep answers
RESAMPLES = 10_000  # bootstrap resamples of the records
SEED = 0  # of the resampling: the same intervals on every run


def answers(spec: str) -> list[dict]:
    """The samples (``{"query", "gold", "step"}``, one a record) of ``FILE:NAME`` (see the module docstring)."""
    path, _, name = spec.partition(":") if not Path(spec).is_file() else (spec, "", "")
    if not Path(path).is_file() and Path(f"{path}.xz").is_file():  # a result compressed since it was named
        path = f"{path}.xz"
    if not Path(path).is_file():
        raise SystemExit(f"{path}: no such result file")
    result = read_result(path)
    found = next((result[group] for group in GROUPS if group in result), None)
    if found is None:
        raise SystemExit(f"{path}: no answers (none of {', '.join(GROUPS)})")
    if not name and len(found) == 1:
        name = next(iter(found))
    if name not in found:
        raise SystemExit(f"{path}: name one of {', '.join(found)} after a colon (FILE:NAME), not {name!r}")
    return found[name]["samples"]


def record_outcomes(first: list[dict], second: list[dict]) -> dict[str, tuple[list[str], list[str]]]:
    """Query → (the first run's outcome of each step, the second's), over the records both runs answered."""
    by_query = {sample["query"]: sample for sample in second}
    missing = [sample["query"] for sample in first if sample["query"] not in by_query]
    if missing or len(first) != len(second):
        raise SystemExit(f"the two runs answered different records ({len(first)} and {len(second)}; {missing[:1]})")
    outcomes = {}
    for sample in first:
        other = by_query[sample["query"]]
        if other["gold"] != sample["gold"]:
            raise SystemExit(f"record {sample['query'][:60]!r}: the two runs hold different gold calls")
        gold = sample["gold"]
        outcomes[sample["query"]] = tuple(
            [outcome(call, run["step"][k], gold[:k]) for k, call in enumerate(gold)] for run in (sample, other)
        )
    return outcomes


def outcome_pairs(first: list[dict], second: list[dict]) -> Counter:
    """(the first run's outcome, the second's) → steps, over the records both runs answered."""
    return Counter(pair for a, b in record_outcomes(first, second).values() for pair in zip(a, b))


def paired(first: list[dict], second: list[dict]) -> dict:
    """Both runs' outcomes of each step, counted: every pair of outcomes, and the exact steps split four ways."""
    return counts(outcome_pairs(first, second))


def counts(pairs: Counter) -> dict:
    """The exact steps split four ways and every pair of outcomes, from ``outcome_pairs``."""
    return {
        "steps": sum(pairs.values()),
        "both exact": pairs["exact", "exact"],
        "only the first exact": sum(n for (a, b), n in pairs.items() if a == "exact" != b),
        "only the second exact": sum(n for (a, b), n in pairs.items() if b == "exact" != a),
        "neither exact": sum(n for (a, b), n in pairs.items() if "exact" not in (a, b)),
        "outcomes (first, second)": {f"{a} / {b}": pairs[a, b] for a in OUTCOMES for b in OUTCOMES if pairs[a, b]},
    }


def exact_by_record(runs: list[tuple[list[dict], list[dict]]]) -> tuple[np.ndarray, np.ndarray, int]:
    """Each record's exact steps, averaged over the seeds (one pair of runs a seed), of the first and the second
    method (two arrays, one entry a record), and the steps a seed answers.  Every seed must answer the same records."""
    seeds = [record_outcomes(first, second) for first, second in runs]
    queries = sorted(seeds[0])
    if any(sorted(seed) != queries for seed in seeds):
        raise SystemExit("the seeds answered different records: pair runs of one split")
    exact = np.array([[[o.count("exact") for o in seed[q]] for q in queries] for seed in seeds], dtype=float)
    return exact[:, :, 0].mean(axis=0), exact[:, :, 1].mean(axis=0), sum(len(seeds[0][q][0]) for q in queries)


def bootstrap_interval(values: np.ndarray, rng: np.random.Generator) -> list[float]:
    """The 95% percentile interval of the sum of ``values`` (one a record) over ``RESAMPLES`` resamples of records."""
    sums = values[rng.integers(0, len(values), (RESAMPLES, len(values)))].sum(axis=1)
    return [float(x) for x in np.percentile(sums, [2.5, 97.5])]


def sign_flip_p(differences: np.ndarray, seeds: int) -> float:
    """Exact two-sided p-value of the sum of ``differences`` (one a record) under sign flips: the chance, each
    record's difference as likely negated, of a sum at least as far from 0.  The differences are whole multiples of
    ``1 / seeds`` (averages of counts), so the distribution over all ``2**records`` flips is counted exactly, one record
    at a time, over whole numbers."""
    whole = np.rint(differences * seeds).astype(int)
    size = int(np.abs(whole).sum())
    chance = np.zeros(2 * size + 1)  # of each sum, -size..size
    chance[size] = 1.0
    for step in np.abs(whole[whole != 0]):
        chance = (np.roll(chance, step) + np.roll(chance, -step)) / 2  # nothing wraps: the sums stay within ±size
    far = np.abs(np.arange(-size, size + 1)) >= abs(whole.sum())
    return min(1.0, float(chance[far].sum()))


def by_record(runs: list[tuple[list[dict], list[dict]]]) -> dict:
    """Each method's exact steps (a seed's) and their difference, with 95% intervals over records and the
    difference's sign-flip p-value (see the module docstring)."""
    first, second, steps = exact_by_record(runs)
    rng = np.random.default_rng(SEED)
    difference = first - second
    return {
        "records": len(first),
        "steps": steps,
        "seeds": len(runs),
        "resamples": RESAMPLES,
        "first exact": {"steps": float(first.sum()), "95% interval": bootstrap_interval(first, rng)},
        "second exact": {"steps": float(second.sum()), "95% interval": bootstrap_interval(second, rng)},
        "first minus second": {
            "steps": float(difference.sum()),
            "95% interval": bootstrap_interval(difference, rng),
            "sign-flip p": sign_flip_p(difference, len(runs)),
            "records differing": int(np.count_nonzero(difference)),
        },
    }


def compared(names: list[tuple[str, str]], runs: list[tuple[list[dict], list[dict]]]) -> dict:
    """Each pair's counts (a seed's), their sum over the seeds (descriptive only) and the analysis by record."""
    each = [outcome_pairs(first, second) for first, second in runs]
    return {
        "pairs": [{"first": a, "second": b, **counts(pairs)} for (a, b), pairs in zip(names, each)],
        "summed over the seeds": counts(sum(each, Counter())),
        "by record": by_record(runs),
    }


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
        f"of {counted['steps']} steps"
    )


def record_lines(analysis: dict, first: str, second: str) -> str:
    """The analysis by record in words: each method's exact steps and the difference, with their intervals."""

    def shown(part: dict, sign: str = "") -> str:
        low, high = part["95% interval"]
        return f"{part['steps']:{sign}.1f} [{low:{sign}.1f}, {high:{sign}.1f}]"

    lead = analysis["first minus second"]
    return (
        f"by record ({analysis['records']} records, {analysis['steps']} steps a seed, {analysis['seeds']} seed(s) "
        f"averaged; 95% bootstrap intervals over records):\n"
        f"  {first}: {shown(analysis['first exact'])} exact steps\n"
        f"  {second}: {shown(analysis['second exact'])} exact steps\n"
        f"  {first} minus {second}: {shown(lead, '+')}; sign-flip p = {lead['sign-flip p']:.3g} "
        f"({lead['records differing']} records differ)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="FILE[:NAME]", help="the first and second run of each pair, in turn")
    parser.add_argument("--json", help="also write the counts and the analysis by record here")
    args = parser.parse_args()
    if len(args.runs) % 2:
        parser.error(f"runs come in pairs (first, second), got {len(args.runs)}")
    names = list(zip(args.runs[::2], args.runs[1::2]))
    result = compared(names, [(answers(first), answers(second)) for first, second in names])
    for pair in result["pairs"]:
        print(line(pair, pair["first"], pair["second"]))
    first, second = names[0] if len(names) == 1 else ("first", "second")
    summed = "" if len(names) == 1 else "summed over the seeds:\n"
    print(f"\n{summed}{table(result['summed over the seeds'], first, second)}\n")
    print(record_lines(result["by record"], first, second))
    if args.json:
        write_json_atomic(args.json, result)


if __name__ == "__main__":
    main()
