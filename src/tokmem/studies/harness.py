"""What every study repeats: one progress bar for a run, learning a round, answering all queries, resuming.

A study is a config dataclass and a function returning a result dict; these are the steps they share.
"""

from __future__ import annotations

import time
from pathlib import Path

from tqdm.auto import tqdm

from tokmem.errors import TokMemError
from tokmem.io import read_json
from tokmem.methods.method import Answer, Method


def progress_bar(total: int, progress: bool):
    """One bar for the whole run: its rate and time left count training examples and test queries alike."""
    return tqdm(total=total, unit="ex", disable=not progress, dynamic_ncols=True, smoothing=0.05)


def learn_round(method: Method, examples, what: str, bar) -> float:
    """One round of learning, the bar advancing after each of its steps; returns the seconds it took."""
    start = time.perf_counter()
    bar.set_description_str(f"{method.name}: learning {what}")
    units, shown = method.epochs * len(examples), 0

    def advance(fraction: float) -> None:
        nonlocal shown
        bar.update(round(units * fraction) - shown)
        shown = round(units * fraction)

    method.on_step = advance
    try:
        method.learn(examples)
    finally:
        method.on_step = None
    bar.update(units - shown)
    return time.perf_counter() - start


def answer_all(method: Method, queries: list[str], batch_size: int, bar) -> list[Answer]:
    """Answers in query order, asked in batches of similar length (less padding)."""
    order = sorted(range(len(queries)), key=lambda i: len(queries[i]))
    answers: list[Answer | None] = [None] * len(queries)
    for first in range(0, len(order), batch_size):
        chunk = order[first : first + batch_size]
        for i, answer in zip(chunk, method.answer([queries[i] for i in chunk])):
            answers[i] = answer
        bar.update(len(chunk))
    return answers


def resumed(json_path, study: str, settings: dict, ignores=()) -> dict | None:
    """The result saved in ``json_path`` to continue from, or None when there is none (or no path: not resuming).

    It must be of the same ``study`` and have the same ``settings`` but for ``ignores`` (the device, …)."""
    if json_path is None or not Path(json_path).is_file():
        return None
    saved = read_json(json_path)
    changed = [key for key in settings if key not in ignores and saved.get("config", {}).get(key) != settings[key]]
    if saved.get("study") != study or changed:
        raise TokMemError(
            f"cannot resume {json_path}: it was run with other settings ({', '.join(changed) or 'another study'}); "
            "use the same options, or drop --resume to start over"
        )
    return saved
