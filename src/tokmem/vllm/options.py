"""A request's TokMem options, read from ``SamplingParams.extra_args`` (``vllm_xargs`` over HTTP).

Flat keys, so that ``vllm serve``'s ``vllm_xargs`` (string, number or boolean values) can carry them:

  ``tokmem_bank``       path of the bank file, as the vLLM worker sees it (required; without it the
                        request is a plain vLLM request and no memory token is ever generated)
  ``tokmem_threshold``  the open-set rule's minimum memory mass at the first position (0–1)
  ``tokmem_max_steps``  memory tokens (segments) per answer
  ``tokmem_procedure``  a procedure to start with (routing skipped)

The defaults are ``tokmem.decoding.decode.DecodeConfig``'s.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from tokmem.bank.memory_bank import MemoryBank
from tokmem.decoding.decode import DecodeConfig
from tokmem.errors import TokMemError
from tokmem.vllm.slots import bank_key

KEYS = ("tokmem_bank", "tokmem_threshold", "tokmem_max_steps", "tokmem_procedure")


class OptionError(TokMemError, ValueError):
    """A request's TokMem options are invalid (vLLM answers HTTP 400 for a ValueError from validation)."""


@dataclass(frozen=True)
class Options:
    bank: str
    threshold: float | None = None  # None: the bank's (decode.open_set_threshold)
    max_steps: int = DecodeConfig.max_steps
    procedure: str | None = None

    @classmethod
    def from_extra_args(cls, extra_args: dict | None) -> Options | None:
        """The options in ``extra_args``, checked field by field; None when the request names no bank."""
        extra_args = extra_args or {}
        if extra_args.get("tokmem_bank") is None:
            stray = [k for k in KEYS if k in extra_args]
            if stray:
                raise OptionError(f"{', '.join(stray)} given without tokmem_bank")
            return None
        options = cls(
            bank=_field(extra_args, "tokmem_bank", str),
            threshold=_field(extra_args, "tokmem_threshold", (int, float), None),
            max_steps=_field(extra_args, "tokmem_max_steps", int, cls.max_steps),
            procedure=_field(extra_args, "tokmem_procedure", str, None),
        )
        if options.threshold is not None and not 0.0 <= options.threshold <= 1.0:
            raise OptionError(f"tokmem_threshold must lie in [0, 1], got {options.threshold}")
        if options.max_steps < 1:
            raise OptionError(f"tokmem_max_steps must be at least 1, got {options.max_steps}")
        return options

    def check_bank(self) -> MemoryBank:
        """The bank, loaded and validated (once per revision); the procedure, if one is forced, must be in it."""
        if not Path(self.bank).is_file():
            raise OptionError(f"tokmem_bank: {self.bank}: bank file not found")
        bank = _load(bank_key(self.bank))
        bank.refuse_shown_schemas("the vLLM plugin")
        if self.procedure is not None:
            bank.row(self.procedure)
        return bank


@functools.lru_cache(maxsize=1024)
def _load(key: tuple[str, int, int]) -> MemoryBank:
    return MemoryBank.load(key[0])


def _field(extra_args: dict, key: str, kind, default=None):
    value = extra_args.get(key, default)
    if value is not default and (not isinstance(value, kind) or isinstance(value, bool)):
        raise OptionError(f"{key} has the wrong type: {value!r}")
    return value
