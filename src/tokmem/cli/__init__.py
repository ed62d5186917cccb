"""The ``tokmem`` command: one module per command group, each adding its subcommands."""

from __future__ import annotations

import argparse

from rich.markup import escape

import tokmem
from tokmem.cli import answer, bank, data, learn, serve
from tokmem.errors import TokMemError
from tokmem.extras import require_extra
from tokmem.report import error_console

GROUPS = (learn, answer, bank, data, serve)


def main(argv=None) -> int:
    return run(build_parser(), argv)


def run(parser: argparse.ArgumentParser, argv=None) -> int:
    """Parse ``argv`` with ``parser`` and call its command's handler: 0, or 2 after a one-line error (a
    ``TokMemError``: no traceback)."""
    args = parser.parse_args(argv)
    if not hasattr(args, "handler"):
        parser.print_help()
        return 2
    try:
        if getattr(args, "extra", None):
            require_extra(args.extra)
        args.handler(args)
    except TokMemError as err:
        error_console.print(f"[bold red]error:[/bold red] {escape(str(err))}", highlight=False)
        return 2
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tokmem", description="One-token procedural memory for frozen language models."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {tokmem.__version__}")
    commands = parser.add_subparsers(metavar="COMMAND")
    for group in GROUPS:
        group.add_commands(commands)
    return parser
