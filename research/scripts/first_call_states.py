"""How many of a kept tool-loop bank's training records reach their first memory token with their query in view, under
a ``max_length`` and a truncation rule: the fault behind tokmem+schema's lost first-call routing.

A record whose query is cut down to the chat prefix's last token reaches its first memory token in the same state as
every other such record, so no index rows can route those first calls to more than one tool: at most the most common
first tool among them is right.  The tool-loop preset cut the 0.5B's tokmem+schema records at 1536 tokens, and the rule
until commit 58f39e8 (``before``: targets kept whole, the query cut from the left down to one token, the targets' end
cut too when they alone did not fit) left 61 of 120 records one query token; the rule since (``now``,
``tokmem.sequences.query_tokens_kept``: the query keeps at least half the window) keeps every query.  Lengths only: no forward
pass.

    python -m research.scripts.first_call_states results/tails-qwen0.5b-banks/shown-refit.safetensors --seed 0 \
        --max-length 1536 --json results/first-call-states-shown-qwen0.5b.json
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from dataclasses import replace

import tokmem
from tokmem.io import write_json_atomic
from tokmem.report import machine
from tokmem.training.sequences import IGNORE, query_tokens_kept
from research.studies.compositional_config import make_config
from research.studies.tool_setup import tool_data
from tokmem.training.train import encode_examples


def query_kept_before(query: int, targets: int, max_length: int) -> int:
    """Query tokens the rule before 58f39e8 kept: all that fit beside the whole targets, at least one."""
    return query if query + targets <= max_length else max(1, max_length - targets)


RULES = {"before": query_kept_before, "now": query_tokens_kept}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bank")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-length", type=int, required=True)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    model = tokmem.load(args.bank, device="cpu")
    config = make_config("cpu", dataset="complexfuncbench", backbone=model.backbone.name.split("+")[0], seed=args.seed)
    records = tool_data(config, (1, config.tools)).train
    whole = encode_examples(model, records, replace(config.train(), max_length=10**9))  # uncut, as the bank lays out
    lengths = []
    for encoded in whole:
        query = next(k for k, label in enumerate(encoded.labels) if label != IGNORE)
        lengths.append((query, len(encoded.input_ids) - query))
    result = {"bank": args.bank, "seed": args.seed, "max_length": args.max_length, "records": len(records)}
    result |= {"longer than max_length": sum(q + t > args.max_length for q, t in lengths), "machine": machine()}
    for name, kept_by in RULES.items():
        kept = [kept_by(q, t, args.max_length) for q, t in lengths]
        blind = [record.steps[0].procedure for record, k in zip(records, kept) if k == 1]
        most = Counter(blind).most_common(1)
        result[name] = {
            "queries cut": sum(k < q for k, (q, _) in zip(kept, lengths)),
            "targets cut": sum(t > args.max_length - k for k, (_, t) in zip(kept, lengths)),
            "queries cut to one token": len(blind),
            "their first tools": dict(Counter(blind).most_common()),
            "first calls any index rows can route, at most": len(records) - len(blind) + (most[0][1] if most else 0),
        }
    write_json_atomic(args.json, result)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
