"""GSM8K format compliance: TokMem's infix memory vs prefix tuning (`research.studies.placement`), as the authors'
reference code runs it.

Train prefix tuning and TokMem (one token) on 20% and 100% of a training subset for 3 epochs, score a held-out
validation split after each epoch and keep the rows of the best epoch (exact match, then compliance), then generate
answers for a test subset.  Reported: compliance (the reference rule: ``#### `` anywhere in the answer), strict
compliance (the answer ends with ``#### <number>``) and exact match of the normalised final number.  The
``reference`` layout frames the problem as the reference code does and puts TokMem's token between the user turn and
the assistant header:

    TokMem          user("question: {q}")  M  assistant-header  "answer: {solution}" EOS
    Prefix tuning   P  user("question: {q}")  assistant-header  "answer: {solution}" EOS

The ``assistant`` layout (this study's first one) puts M after the assistant header, with the bare
question and solution.  ``run_study`` writes the result with the study's table
(`research.studies.gsm8k_placement_report`).  The settings and presets: `research.studies.gsm8k_placement_config`.
"""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import asdict
from pathlib import Path

from tqdm.auto import tqdm

import tokmem
from tokmem.backbones import load_backbone
from tokmem.data.gsm8k import Problem, gsm8k_compliant, gsm8k_strictly_compliant, load_gsm8k
from tokmem.decoding.decode import complete
from tokmem.errors import DataError, TokMemError
from tokmem.eval import metrics
from tokmem.io import write_json_atomic
from research.methods import prefix
from tokmem.model import TokMemModel
from tokmem.report import machine
from tokmem.training.sequences import Encoded
from research.studies.gsm8k_placement_config import FRAMES, LAYOUTS, GSM8KConfig
from research.studies.gsm8k_placement_report import write_outputs
from research.studies.harness import resumed
from research.studies.placement import LABELS, METHODS, build, context, targeted
from tokmem.training.train import fit


def run_gsm8k(config: GSM8KConfig, json_path=None, resume: bool = False) -> dict:
    """Train each method on each fraction of the training subset, keep its best epoch by validation; score the test answers.

    With ``json_path`` the result so far is written after every run; ``resume`` skips the runs it already holds.
    """
    _check_gsm8k(config)
    start = time.perf_counter()
    train_set, validation_set = split_gsm8k(load_gsm8k(Path(config.data) / "train.jsonl"), config)
    test_set = load_gsm8k(Path(config.data) / "test.jsonl")[: config.test_examples]
    result = _gsm8k_start(config, json_path, resume)
    earlier = result["seconds"]
    result.update(train_examples=len(train_set), validation_examples=len(validation_set), test_examples=len(test_set))
    backbone = None
    for fraction in config.fractions:
        subset = train_set[: max(1, round(fraction * len(train_set)))]
        runs = result["gsm8k"].setdefault(f"{100 * fraction:g}", {})
        for method in METHODS:
            if method in runs:
                continue
            backbone = backbone or load_backbone(config.backbone, device=config.device)
            runs[method] = _gsm8k_run(backbone, method, subset, validation_set, test_set, config)
            result["seconds"] = round(earlier + time.perf_counter() - start, 1)
            if json_path is not None:
                write_json_atomic(json_path, result)
    return result


def _gsm8k_start(config: GSM8KConfig, json_path, resume: bool) -> dict:
    """The result so far: the saved JSON when resuming (its settings must match but for the device), else an empty one."""
    settings = json.loads(json.dumps(asdict(config)))  # as the JSON holds them: tuples become lists
    saved = resumed(json_path if resume else None, "gsm8k", settings, ("device", "progress"))
    if saved is not None:
        return saved
    return {
        "study": "gsm8k",
        "gsm8k": {},
        "seconds": 0.0,
        "config": settings,
        "tokmem": tokmem.__version__,
        "machine": machine(),
    }


def _check_gsm8k(config: GSM8KConfig) -> None:
    if config.layout not in LAYOUTS:
        raise TokMemError(f"unknown GSM8K layout '{config.layout}' (choose from {', '.join(LAYOUTS)})")
    if config.epochs < 1 or config.validation_examples < 1:
        raise TokMemError("epochs and validation_examples must be at least 1")


def split_gsm8k(problems: list[Problem], config: GSM8KConfig) -> tuple[list[Problem], list[Problem]]:
    """(training subset, validation split): the last ``validation_examples`` problems are held out for
    validation, the training subset is the first ``train_examples`` of the rest."""
    held_out = config.validation_examples
    if len(problems) <= held_out:
        raise DataError(
            f"{config.data}/train.jsonl: {len(problems)} problems, too few to hold out {held_out} for validation"
        )
    return problems[:-held_out][: config.train_examples], problems[-held_out:]


def gsm8k_context(model: TokMemModel, method: str, layout: str, question: str) -> list[int]:
    """What comes before the answer, in training and at test time: the question framed and the rows placed as ``layout`` says."""
    return context(model, method, FRAMES[layout][0].format(question), layout)


def gsm8k_encode(model: TokMemModel, method: str, layout: str, problem: Problem) -> Encoded:
    """One training sequence: the context, then the framed answer and EOS, the only labelled tokens."""
    answer = FRAMES[layout][1].format(problem.answer)
    return targeted(
        gsm8k_context(model, method, layout, problem.question), prefix.response_ids(model.backbone.tokenizer, answer)
    )


def gsm8k_scores(answers: list[str], problems: list[Problem]) -> dict:
    """Compliance (the reference rule: ``#### `` anywhere), strict compliance (ends with ``#### <number>``) and exact match."""
    return {
        "compliance": metrics.mean(map(gsm8k_compliant, answers)),
        "strict_compliance": metrics.mean(map(gsm8k_strictly_compliant, answers)),
        "em": metrics.mean(metrics.gsm8k_exact_match(a, p.answer) for a, p in zip(answers, problems)),
    }


class BestByValidation:
    """The validation curve of a training run and a copy of the bank at its best epoch.

    Best: the highest exact match, then the highest compliance; the earliest of equals.  ``offer`` is
    called from ``fit``'s ``on_step`` (the rows are live there); ``restore`` after ``fit``.
    """

    def __init__(self):
        self.curve: list[dict] = []
        self.epoch: int | None = None
        self._key: tuple[float, float] | None = None
        self._bank = None

    def offer(self, model: TokMemModel, epoch: int, scores: dict) -> None:
        self.curve.append({"epoch": epoch, **scores})
        key = (scores["em"], scores["compliance"])
        if self._key is None or key > self._key:
            model.write_rows()
            self.epoch, self._key, self._bank = epoch, key, copy.deepcopy(model.bank)

    def restore(self, model: TokMemModel) -> None:
        """Put the best epoch's rows back into the model."""
        model.bank = self._bank


def epoch_ends(examples: int, batch_size: int, epochs: int) -> dict[int, int]:
    """The optimiser step that completes each epoch → that epoch.

    ``fit`` runs the epochs back to back, so when the examples do not fill whole batches a batch spans
    two epochs: an epoch ends at the step that holds its last example (of two ending at one step, the later counts).
    """
    return {math.ceil(epoch * examples / batch_size): epoch for epoch in range(1, epochs + 1)}


def _gsm8k_run(backbone, method: str, train_set, validation_set, test_set, config: GSM8KConfig) -> dict:
    model = build(method, 1, backbone, name="gsm8k")
    encoded = [gsm8k_encode(model, method, config.layout, p) for p in train_set]
    tqdm.write(f"GSM8K {LABELS[method]}: training on {len(train_set)} problems, {config.epochs} epochs")
    best, ends = BestByValidation(), epoch_ends(len(encoded), config.batch_size, config.epochs)

    def validate(step: int, total: int) -> None:
        if step in ends:
            answers = _answer(model, method, validation_set, config, f"validating epoch {ends[step]}")
            best.offer(model, ends[step], gsm8k_scores(answers, validation_set))

    report = fit(model, encoded, config.train(), on_step=validate)
    best.restore(model)
    answers = _answer(model, method, test_set, config, "testing")
    return {
        **gsm8k_scores(answers, test_set),
        "best_epoch": best.epoch,
        "validation": best.curve,
        "train_examples": len(train_set),
        "steps": report.steps,
        "train_seconds": round(report.seconds, 1),
        "samples": [{"question": p.question, "answer": a} for p, a in zip(test_set[:3], answers)],
    }


def _answer(model, method: str, problems: list[Problem], config: GSM8KConfig, what: str) -> list[str]:
    """Greedy answers after each problem's context, laid out as in training."""
    contexts = [gsm8k_context(model, method, config.layout, p.question) for p in problems]
    decode = config.decode()
    size = decode.batch_size
    answers = []
    for start in tqdm(
        range(0, len(contexts), size),
        desc=what,
        unit="batch",
        disable=not config.progress,
        dynamic_ncols=True,
        leave=False,
    ):
        answers += complete(model, contexts[start : start + size], decode)
    return answers


def run_study(config: GSM8KConfig, json_path, resume: bool = False) -> dict:
    """Run the study, writing its JSON after every run (so that ``resume`` can skip the finished ones), then its
    markdown table (.md beside it)."""
    json_path = Path(json_path)
    result = run_gsm8k(config, json_path, resume)
    write_outputs(result, json_path)
    return result
