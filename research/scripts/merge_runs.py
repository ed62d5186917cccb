"""One study run in pieces made whole: result files with the same settings but for their methods (one process a
method, as ``research/scripts/gpu_qwen.sh`` runs them side by side on one GPU) merged into one run per seed and budget.

Each run is saved where ``--seeds`` and ``--epoch-budgets`` reuse finished runs, ``<out stem>-runs/epochs<E>-seed<S>
.json``, so the study's own command (printed) then writes the combined result and its tables without running
anything; a single compositional run is written as ``out`` with its tables instead.

    python -m research.scripts.merge_runs results/loop-cfb-qwen0.5b-seeds.json --methods tokmem,lora cfb-s*-*.json
"""

import argparse
import json
from pathlib import Path

from tokmem.io import write_json_atomic
from research.studies import compositional_report

MAY_DIFFER = ("methods", "device")  # the settings the pieces of one run may differ in


def merged(a, b):
    """``a`` and ``b`` as one: dicts key by key (so the methods of both), lists of dicts item by item; else ``a``
    (``b`` where ``a`` is None: a piece without the adaptation phase has none)."""
    if a is None:
        return b
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: merged(a[k], b[k]) if k in a and k in b else a.get(k, b.get(k)) for k in {**a, **b}}
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and all(isinstance(x, dict) for x in a + b):
        return [merged(x, y) for x, y in zip(a, b)]
    return a


def merge_run(pieces: list[dict], methods: list[str]) -> dict:
    """The pieces of one run (a seed, a budget) as one run of ``methods`` (in that order; a piece may hold more); an error
    when the pieces were run with other settings or lack a method."""
    first = pieces[0]["config"]
    for piece in pieces[1:]:
        changed = [k for k in first if k not in MAY_DIFFER and piece["config"].get(k) != first[k]]
        if changed:
            raise SystemExit(f"the pieces differ in {', '.join(changed)}: not one run")
    have = [m for p in pieces for m in p["config"]["methods"]]
    if missing := [m for m in methods if m not in have]:
        raise SystemExit(f"seed {first['seed']}, {first['epochs']} epochs: no piece has {', '.join(missing)}")
    run = pieces[0]
    for piece in pieces[1:]:
        run = merged(run, piece)
    run["config"] = run["config"] | {"methods": methods}
    if "methods" in run:  # a compositional run: its methods in order, those asked for only
        run["methods"] = {m: run["methods"][m] for m in methods}
    return run | {"finished": True}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the combined result's JSON (its runs go to <stem>-runs/)")
    parser.add_argument("--methods", required=True, help="comma-separated, in the order of the study's --methods")
    parser.add_argument("pieces", nargs="+", type=Path, help="single-run result files (not --seeds combinations)")
    args = parser.parse_args(argv)
    methods = args.methods.split(",")
    by_run: dict[tuple[int, int], list[dict]] = {}  # (epochs, seed): the pieces of that run
    for path in args.pieces:
        piece = json.loads(path.read_text())
        if piece.get("study") == "repeats":
            raise SystemExit(f"{path}: a combination of runs; give its runs (<stem>-runs/epochs*-seed*.json)")
        by_run.setdefault((piece["config"]["epochs"], piece["config"]["seed"]), []).append(piece)
    runs = {key: merge_run(pieces, methods) for key, pieces in sorted(by_run.items())}
    if len(runs) == 1 and "data" in next(iter(runs.values())):  # one compositional run: its JSON and tables
        print(*compositional_report.write_outputs(next(iter(runs.values())), args.out), sep="\n")
        return
    folder = args.out.with_name(f"{args.out.stem}-runs")
    for (epochs, seed), run in runs.items():
        print(write_json_atomic(folder / f"epochs{epochs}-seed{seed}.json", run))
    budgets, seeds = (",".join(map(str, sorted({key[k] for key in runs}))) for k in (0, 1))
    print(
        f"then: python -m research bench <study> <its options> --methods {args.methods} --epoch-budgets {budgets} "
        f"--seeds {seeds} --json {args.out}"
    )


if __name__ == "__main__":
    main()
