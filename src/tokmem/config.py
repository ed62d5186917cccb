"""Config fields that carry their command-line help: `tokmem.cli.options` turns each field into an option."""

from __future__ import annotations

from dataclasses import field


def option(default, text: str, **metadata):
    """A dataclass field with default ``default`` and help ``text``; ``metadata`` may rename its ``flag``."""
    return field(default=default, metadata={"help": text, **metadata})
