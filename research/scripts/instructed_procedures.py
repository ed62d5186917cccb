"""Which built-in procedures can the demo's backbone perform when instructed?

The demo compares TokMem with the plain backbone given each procedure's written instruction, so its
procedures should be ones the backbone performs when instructed.  This answers held-out queries of
every built-in procedure (no chains, no training) with the gold instruction in the prompt, and prints
the exact match per procedure.

    python -m research.scripts.instructed_procedures --per-procedure 8 --json results/instructed.json
"""

from __future__ import annotations

import argparse
import time

from rich.table import Table

from tokmem import create
from tokmem.data.builtin import demo_dataset
from tokmem.demo import gold_procedures, instructed_scores
from tokmem.report import console, machine, percent, write_json
from tokmem.cli.options import add_backbone


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_backbone(parser)
    parser.add_argument("--per-procedure", type=int, default=8, help="held-out queries per procedure")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()

    _, test = demo_dataset(
        seed=args.seed, train_per_procedure=0, test_per_procedure=args.per_procedure, train_chains=0, test_chains=0
    )
    plain = create(args.backbone, device="cpu")
    start = time.perf_counter()
    scores = instructed_scores(plain, test, gold_procedures)
    table = Table(title=f"{args.backbone} with each procedure's instruction ({args.per_procedure} queries each)")
    table.add_column("procedure")
    table.add_column("exact match", justify="right")
    for name, score in scores["exact_match_per_procedure"].items():
        table.add_row(name, percent(score))
    table.add_section()
    table.add_row("all", percent(scores["exact_match"]))
    console.print(table)
    console.print(
        f"{len(test)} queries in {time.perf_counter() - start:.0f} s, {scores['prompt_tokens']:.0f} prompt tokens per query"
    )
    if args.json:
        write_json(args.json, {**vars(args), **scores, "machine": machine()})


if __name__ == "__main__":
    main()
