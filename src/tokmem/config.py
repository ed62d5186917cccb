"""Config fields that carry their command-line help: `tokmem.cli.options` turns each field into an option.

The demo's and a study's settings name the fields of the library's configs they set (``option_of``: a study's
``tokmem_lr`` is a `TrainConfig`'s ``lr``), so that each default is defined once, in the library's config, and the
settings build those configs in one way (``config_from``).
"""

from __future__ import annotations

from dataclasses import MISSING, field, fields


def option(default, text: str, **metadata):
    """A dataclass field with default ``default`` and help ``text``; ``metadata`` may rename its ``flag``."""
    return field(default=default, metadata={"help": text, **metadata})


def option_of(config: type, name: str, text: str | None = None, default=MISSING, **metadata):
    """An option that is field ``name`` of the dataclass ``config``, under the name the settings give it: its default
    is ``config``'s (unless ``default`` is given: a study's own), its help ``config``'s too unless ``text`` says what
    the setting means there (e.g. that every method of a study trains so)."""
    source = next(f for f in fields(config) if f.name == name)
    own = source.default if default is MISSING else default
    return option(own, text or source.metadata["help"], of=config, field=name, **metadata)


def config_from(settings, config: type, **changes):
    """The ``config`` object that the ``option_of`` fields of ``settings`` set, with ``changes``."""
    values = {
        f.metadata["field"]: getattr(settings, f.name) for f in fields(settings) if f.metadata.get("of") is config
    }
    return config(**values | changes)
