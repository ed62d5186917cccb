"""Errors that tell the user what to fix (file, line, field)."""


class TokMemError(Exception):
    """Base class for every error tokmem raises on bad input."""


class DataError(TokMemError, ValueError):
    """A procedures / catalog / task file is malformed."""


class BankError(TokMemError, ValueError):
    """A memory bank file is missing, corrupted, or does not fit the backbone."""


class BackboneError(TokMemError, ValueError):
    """A backbone spec cannot be resolved or loaded."""
