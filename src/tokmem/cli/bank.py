"""``tokmem bank show|rm|rename|merge``: inspect and edit bank files."""

from __future__ import annotations

import json

from rich.table import Table

from tokmem.report import console, write_json


def add_commands(commands) -> None:
    bank = commands.add_parser("bank", help="inspect and edit bank files").add_subparsers(metavar="ACTION")
    show = bank.add_parser("show", help="list the procedures, norms and backbone of a bank")
    show.add_argument("bank")
    show.add_argument("--json", metavar="PATH")
    show.set_defaults(handler=cmd_bank_show)
    rm = bank.add_parser("rm", help="remove procedures")
    rm.add_argument("bank")
    rm.add_argument("names", nargs="+")
    rm.set_defaults(handler=cmd_bank_rm)
    rename = bank.add_parser("rename", help="rename a procedure")
    rename.add_argument("bank")
    rename.add_argument("old")
    rename.add_argument("new")
    rename.set_defaults(handler=cmd_bank_rename)
    merge = bank.add_parser("merge", help="merge banks trained for the same backbone")
    merge.add_argument("banks", nargs="+")
    merge.add_argument("--out", required=True)
    merge.set_defaults(handler=cmd_bank_merge)


def cmd_bank_show(args) -> None:
    from tokmem.bank.memory_bank import MemoryBank

    bank = MemoryBank.load(args.bank)
    meta = bank.metadata()
    console.print(
        f"[bold]{args.bank}[/bold]: {len(bank)} procedures, width {bank.hidden_size}, "
        f"{'decoupled (index + steer)' if bank.decoupled else 'coupled'}"
        f"{', shows its tools schemas' if bank.shows_schemas else ''}"
        f"{f', {bank.context_rows()}' if bank.context_rows() else ''}, backbone {bank.backbone.get('name')} "
        f"({bank.backbone.get('fingerprint')}), {bank.parameter_count():,} parameters"
    )
    table = Table()
    for column in ("#", "procedure", "norm", "description"):
        table.add_column(column, overflow="fold")
    for row, (name, norm) in enumerate(zip(bank.names, meta["norms"]["per_row"])):
        table.add_row(str(row), name, f"{norm:.3f}", bank.descriptions[row])
    console.print(table)
    for name, schema in bank.tool_schemas().items():
        if schema is not None:
            console.print(
                f"[bold]{name}[/bold] arguments schema: {json.dumps(schema, ensure_ascii=False)}",
                highlight=False,
                soft_wrap=True,
            )
    for name, key_sets in zip(bank.names, bank.key_sets):
        if key_sets is not None:
            listed = "; ".join(", ".join(keys) for keys in key_sets.keys)
            console.print(f"[bold]{name}[/bold] key sets (chosen where it is routed): {listed}", highlight=False)
    if args.json:
        write_json(args.json, meta)


def _edit(path, edit, out=None) -> None:
    from tokmem.bank.memory_bank import MemoryBank

    bank = MemoryBank.load(path)
    edit(bank)
    bank.save(out or path)
    console.print(f"saved {out or path}: {len(bank)} procedures")


def cmd_bank_rm(args) -> None:
    _edit(args.bank, lambda bank: [bank.remove(name) for name in args.names])


def cmd_bank_rename(args) -> None:
    _edit(args.bank, lambda bank: bank.rename(args.old, args.new))


def cmd_bank_merge(args) -> None:
    from tokmem.bank.memory_bank import MemoryBank

    _edit(args.banks[0], lambda bank: [bank.merge(MemoryBank.load(other)) for other in args.banks[1:]], out=args.out)
