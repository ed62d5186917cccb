"""GSM8K: grade-school maths problems, one JSON object a line (``{"question": …, "answer": …}``).

Every answer ends with ``#### <number>``: the answer format, its compliance rules and its final number are here;
the placement study scores answers by them (`tokmem.eval.metrics.gsm8k_exact_match`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from tokmem.io import read_jsonl
from tokmem.errors import DataError


NUMBER = r"(?P<sign>[-+]?)\$?(?P<digits>\d(?:[\d,]*\d)?(?:\.\d+)?|\.\d+)"
COMPLIANT = re.compile(r"####\s*" + NUMBER + r"\s*\Z")


def gsm8k_compliant(text: str) -> bool:
    """The reference code's compliance rule: ``"#### "`` (the marker and a space) occurs anywhere in the answer."""
    return "#### " in text


def gsm8k_strictly_compliant(text: str) -> bool:
    """Whether the text ends with ``#### <number>`` (commas, a sign, decimals, a leading $ allowed)."""
    return COMPLIANT.search(text) is not None


def extract_final_number(text: str) -> str | None:
    """The first number after the last ``####``, normalised; None when there is none.

    Commas, ``$``, a ``+`` sign, units and trailing words are dropped, as are zeros after the
    decimal point: ``"#### $1,000.50 dollars"`` gives ``"1000.5"``, ``"5.00"`` gives ``"5"``,
    ``"-0"`` gives ``"0"``.
    """
    _, marker, tail = text.rpartition("####")
    match = re.search(NUMBER, tail) if marker else None
    if match is None:
        return None
    value = Decimal(match["sign"] + match["digits"].replace(",", "")).normalize()
    return format(value if value != 0 else Decimal(0), "f")


@dataclass(frozen=True)
class Problem:
    question: str
    answer: str  # worked solution ending with "#### <number>"


def load_gsm8k(path) -> list[Problem]:
    """Read a GSM8K JSONL file; a bad line is a DataError naming its file, line and field."""
    path = Path(path)
    problems = [_parse(obj, path, number) for number, obj in read_jsonl(path)]
    if not problems:
        raise DataError(f"{path}: no problems (the file is empty)")
    return problems


def _parse(obj, path: Path, line: int) -> Problem:
    if not isinstance(obj, dict):
        raise DataError(f"{path}:{line}: expected a JSON object with 'question' and 'answer'")
    for key in ("question", "answer"):
        if not isinstance(obj.get(key), str) or not obj[key].strip():
            raise DataError(f"{path}:{line}: field '{key}' is missing or empty (must be a non-empty string)")
    if not gsm8k_strictly_compliant(obj["answer"]):
        raise DataError(f"{path}:{line}: field 'answer' does not end with '#### <number>'")
    return Problem(obj["question"], obj["answer"])
