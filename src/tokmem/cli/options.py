"""Command-line options generated from config dataclasses: the one mapping from a config to a parser.

Each field becomes ``--field-name`` (or its ``metadata["flag"]``): the type comes from the annotation,
the default from the field, the help from ``field(metadata={"help": ...})``, the choices from a
``Literal[...]``; a bool becomes ``--x/--no-x``; a tuple becomes a comma-separated list.  So a default
lives only in its dataclass, and a new config field is a new option without another edit.
"""

from __future__ import annotations

import argparse
import types
import typing
from dataclasses import MISSING, Field, fields

from tokmem.backbones import DEFAULT_BACKBONE, DEVICE_HELP
from tokmem.training.train import TrainConfig


def int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got '{text}'") from None


def name_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def add_options(
    parser, config: type, names=None, skip=(), prefix: str = "", unset: bool = False, recipe: dict | None = None
) -> None:
    """Add an option per field of the dataclass ``config`` that has help (those in ``names``, in that order; default:
    all but ``skip``).  ``prefix`` goes before each destination and flag (``metadata["flag"]`` renames one).
    ``unset``: every default is None, so that a preset (or the dataclass) decides what an unset option means;
    ``recipe``: the values a command's own layer sets over the dataclass's (``train.PICKED_RECIPE``), shown as the
    defaults of their options (then unset: the command applies its layer)."""
    hints = typing.get_type_hints(config)
    by_name = {f.name: f for f in fields(config) if "help" in f.metadata}
    for name in names or [n for n in by_name if n not in skip]:
        field = by_name[name]
        flag = field.metadata.get("flag") or f"--{(prefix + name).replace('_', '-')}"
        layered = unset or (recipe is not None and name in recipe)
        default = None if layered else _default(field)
        required = not layered and field.default is MISSING and field.default_factory is MISSING
        help = _recipe_help(field, recipe[name]) if recipe and name in recipe else _help(field, unset)
        parser.add_argument(
            flag, dest=prefix + name, default=default, help=help, required=required, **_kind(hints[name])
        )


def values(args: argparse.Namespace, config: type, prefix: str = "", names=None) -> dict:
    """The options ``add_options`` added for ``config`` (those in ``names``; default: all), by field name, leaving out
    those that are None (not given: the dataclass's or the preset's default applies)."""
    found = {
        f.name: getattr(args, prefix + f.name, None)
        for f in fields(config)
        if "help" in f.metadata and (names is None or f.name in names)
    }
    return {name: value for name, value in found.items() if value is not None}


def _default(field: Field):
    if field.default is not MISSING:
        return field.default
    return field.default_factory() if field.default_factory is not MISSING else None


def _help(field: Field, unset: bool) -> str:
    """The field's help and its default; with ``unset``, the preset may set another."""
    text, own = field.metadata.get("help", ""), _default(field)
    if own is None or isinstance(own, bool):
        return text.replace("%", "%%")
    shown = ",".join(map(str, own)) if isinstance(own, tuple) else own
    where = f"the preset's, else {shown}" if unset else shown
    return f"{text} (default {where})".replace("%", "%%")


def _recipe_help(field: Field, value) -> str:
    """The help of an option a command's recipe sets: its value there, beside the dataclass's."""
    return f"{field.metadata['help']} (default {_shown(value)}; the config's {_shown(_default(field))})".replace(
        "%", "%%"
    )


def _shown(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _kind(annotation) -> dict:
    """argparse keywords for a field's type: ``X | None`` is X; bools are ``--x/--no-x``."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is bool:
        return {"action": argparse.BooleanOptionalAction}
    if origin is typing.Literal:
        return {"choices": arguments}
    if origin is tuple:
        return {"type": int_list if arguments[0] is int else name_list}
    return {"type": annotation}


def add_backbone(parser) -> None:
    """``--backbone``, of the commands that build on one without a config of their own."""
    parser.add_argument("--backbone", default=DEFAULT_BACKBONE, help=f"backbone spec (default {DEFAULT_BACKBONE})")


def add_common(parser) -> None:
    """The options of every command that computes: where its numbers go, the device, the seed, the progress bars."""
    parser.add_argument("--json", metavar="PATH", help="also write the numbers as JSON")
    parser.add_argument("--device", help=DEVICE_HELP)
    parser.add_argument(
        "--seed", type=int, default=TrainConfig.seed, help="seed of the data order, the new rows and sampling"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def add_off_topic(parser) -> None:
    parser.add_argument(
        "--off-topic",
        action="append",
        metavar="SET_OR_FILE",
        help="off-topic queries to count how many the bank leaves to the plain backbone: a built-in set (chat, "
        "bfcl-irrelevance, bfcl-live-irrelevance) or a file (one query a line, or JSONL with 'query'); repeatable "
        "(default: chat, and bfcl-irrelevance where bfcl-eval is installed; 'none': no count)",
    )


def off_topic_specs(args) -> list[str]:
    from tokmem.eval.open_set import default_sets

    return [s for s in (args.off_topic or default_sets()) if s != "none"]
