"""What a tool-loop study's per-step answers get wrong, read from its result file's samples.

Each per-step answer is read as the scorer reads it (`metrics.read_call`: canonical arguments) and set against the
gold call it was due for, counted as: exact, another tool, the right tool with other argument keys, the right tool
and keys with other values, not a JSON call (cut at the token limit or malformed), or no call at all.  Argument
values are also split by whether their text appears in the query (those that do not were copied from an earlier
result or rewritten, as dates are).  Files written before the samples kept no-call steps in place (their ``step``
lists are shorter than ``gold``) are read over their aligned records only.

    python benchmarks/loop_answers.py results/loop-cfb-flights.json [more.json ...]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

from tokmem.eval.metrics import read_call

Call = tuple  # (name, canonical arguments), as the scorer reads a call (`metrics.read_call`)


def category(gold: Call, answer: Call | None) -> str:
    if answer is None:
        return "no call"
    name, arguments = answer
    if name is None:
        return "not a JSON call"
    if answer == gold:
        return "exact"
    if name != gold[0]:
        return "another tool"
    return "other keys" if dict(arguments).keys() != dict(gold[1]).keys() else "other values"


def value_hits(query: str, gold: Call, answer: Call | None) -> Counter:
    """Per gold argument: whether its value's text is in the query, and whether the answer has that value."""
    hits: Counter = Counter()
    given = dict(answer[1]) if answer is not None and answer[0] == gold[0] else {}
    for key, value in dict(gold[1]).items():
        where = "in query" if str(value).lower() in query.lower() else "not in query"
        hits[where, "total"] += 1
        hits[where, "right"] += key in given and given[key] == value
    return hits


def summary(samples: list[dict]) -> dict:
    aligned = [s for s in samples if len(s["step"]) == len(s["gold"])]
    counts, values = Counter(), Counter()
    for sample in aligned:
        for gold_text, text in zip(sample["gold"], sample["step"]):
            gold, answer = read_call(gold_text), None if text is None else read_call(text)
            counts[category(gold, answer)] += 1
            values += value_hits(sample["query"], gold, answer)
    return {
        "records": f"{len(aligned)} of {len(samples)}",
        "steps": sum(counts.values()),
        **counts,
        **{f"values {w}": f"{values[w, 'right']} of {values[w, 'total']} right" for w in ("in query", "not in query")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+")
    for path in parser.parse_args().files:
        for name, method in json.load(open(path))["methods"].items():
            print(f"{path} {method.get('label', name)}: {json.dumps(summary(method['samples']))}")


if __name__ == "__main__":
    main()
