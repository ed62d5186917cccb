"""Errors that tell the user what to fix (file, line, field)."""


class TokMemError(Exception):
    """Base class for every error tokmem raises on bad input."""


class DataError(TokMemError, ValueError):
    """A procedures / catalog / task file is malformed."""


class BankError(TokMemError, ValueError):
    """A memory bank file is missing, corrupted, or does not fit the backbone."""


class BackboneError(TokMemError, ValueError):
    """A backbone spec cannot be resolved or loaded."""


def clipped(text: str, most: int = 200) -> str:
    """``text`` as an error message may echo it: at most ``most`` characters, then how long it was."""
    return text if len(text) <= most else f"{text[:most]}… ({len(text)} characters)"


def listed(names, most: int = 10) -> str:
    """Names as an error message lists them: the first ``most``, each cut short, then how many more."""
    names = list(names)
    shown = ", ".join(clipped(repr(name), 80) for name in names[:most])
    return f"{shown} and {len(names) - most} more" if len(names) > most else shown
