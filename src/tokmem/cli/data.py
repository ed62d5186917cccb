"""``tokmem data import``: real tool-calling data (NESTFUL, BFCL, xLAM) to procedures JSONL."""

from __future__ import annotations

from tokmem.errors import TokMemError
from tokmem.report import console, write_json


def add_commands(commands) -> None:
    data = commands.add_parser("data", help="real tool-calling data").add_subparsers(metavar="ACTION")
    imports = data.add_parser(
        "import",
        help="turn a NESTFUL, BFCL, xLAM or OpenAI chat-format file into procedures JSONL (one step per call)",
        description="Each usable record becomes an example whose steps are its calls (the tool is the procedure, the "
        "call JSON the response). Malformed records are refused; records that cannot be used are counted as skipped.",
    )
    imports.add_argument(
        "input",
        metavar="IN",
        help="the data file; BFCL: a question file (its possible_answer/ "
        "file beside it) or the bfcl folder (every question file with answers)",
    )
    imports.add_argument("--format", required=True, choices=sorted(IMPORTERS))
    imports.add_argument("--out", required=True, help="procedures JSONL to write")
    imports.add_argument(
        "--catalog",
        help="also write the called tools' schemas here (JSONL: name, description, "
        "parameters; tokmem train --catalog reads it)",
    )
    imports.add_argument("--tools", help="NESTFUL: the tools' spec file (default: X-spec.json beside X-data.json)")
    imports.add_argument(
        "--execute",
        action="store_true",
        help="BFCL multi-turn: run every gold call on BFCL's simulated backends, from each conversation's "
        "initial_config, so that each step carries its result (needs bfcl-eval, which make install adds)",
    )
    imports.add_argument("--json", metavar="PATH", help="also write the counts as JSON")
    imports.set_defaults(handler=cmd_data_import)


def _import_nestful(args):
    from tokmem.data.nestful import import_nestful

    return import_nestful(args.input, args.tools)


def _import_bfcl(args):
    from tokmem.data.bfcl import import_bfcl

    return import_bfcl(args.input, execute=args.execute)


def _import_xlam(args):
    from tokmem.data.xlam import import_xlam

    return import_xlam(args.input)


def _import_openai(args):
    from tokmem.data.openai_chat import import_openai

    return import_openai(args.input)


def _check_options(args) -> None:
    """``--tools`` is NESTFUL's alone (the other formats carry their tools' schemas), ``--execute`` BFCL's."""
    if args.tools is not None and args.format != "nestful":
        raise TokMemError(f"--tools is for --format nestful; {args.format} files carry their tools' schemas")
    if args.execute and args.format != "bfcl":
        raise TokMemError("--execute is for --format bfcl: its multi-turn calls run on BFCL's simulated backends")


IMPORTERS = {"nestful": _import_nestful, "bfcl": _import_bfcl, "xlam": _import_xlam, "openai": _import_openai}


def cmd_data_import(args) -> None:
    from tokmem.data.procedures import save_catalog, save_examples

    _check_options(args)
    imported = IMPORTERS[args.format](args)
    save_examples(imported.examples, args.out)
    if args.catalog:
        save_catalog(imported.catalog.values(), args.catalog)
    histogram = imported.calls_per_example()
    calls = sum(n * count for n, count in histogram.items())
    lines = [
        f"read {imported.records} records from {args.input}",
        f"wrote {len(imported.examples)} examples ({calls} calls) to {args.out}",
        "calls per example: " + ", ".join(f"{n}: {count}" for n, count in histogram.items()),
        f"tools: {len(imported.catalog)}" + (f" (schemas in {args.catalog})" if args.catalog else ""),
        "skipped:" + ("" if imported.skipped else " nothing"),
        *(f"  {count} {reason}" for reason, count in imported.skipped.items()),
    ]
    console.print("\n".join(lines), highlight=False, soft_wrap=True)
    if args.json:
        write_json(
            args.json,
            {
                "input": args.input,
                "format": args.format,
                "executed": args.execute,
                "out": args.out,
                "catalog": args.catalog,
                "records": imported.records,
                "examples": len(imported.examples),
                "calls": calls,
                "calls_per_example": histogram,
                "tools": list(imported.catalog),
                "skipped": dict(imported.skipped),
            },
        )
