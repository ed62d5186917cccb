"""GSM8K: grade-school maths problems, one JSON object a line (``{"question": …, "answer": …}``).

Every answer ends with ``#### <number>``, the format the placement study checks for compliance.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokmem.io import read_jsonl
from tokmem.errors import DataError
from tokmem.eval.metrics import gsm8k_strictly_compliant


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
