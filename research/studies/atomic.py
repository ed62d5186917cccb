"""Atomic recall on Super-Natural Instructions: TokMem against Base, RAG, fine-tuning and replay.

Each SNI task is one procedure; tasks come in ascending task-id order and every method is asked the
same user turn: ``{Definition}\n\n{input}`` (``query="definition"``, the paper's protocol as the
reference code builds it) or the input alone (``query="input"``: the memory token must carry the
instruction).  Two schedules:

- ``joint`` (the reference code, ``main_in_domain.py``): for every checkpoint k, every method is built
  afresh and learns the training examples of the first k tasks shuffled together in one round (TokMem:
  lr 1e-3, linear warm-up and decay by default);
- ``sequential`` (the paper's text): tasks arrive one at a time, every method learns each task as one
  round (TokMem: lr 5e-3, constant, renormalised after each round), and is asked after the first k.

After a checkpoint every method answers the test queries of all k tasks.  The split is the reference
code's (``tokmem.data.sni``: MD5 order, test first).  Scores: ROUGE-L (0–100, Porter-stemmed, against
an instance's first output, as the reference scores), averaged per task, then over tasks; the routing
accuracy of TokMem and the retrieval accuracy of RAG (in [0, 1]); the trainable parameter count.

The sample-efficiency variant trains fresh methods on a mixture of the first 10 tasks (one joint round)
with 10, 20, 50, … training examples per task, and scores them on the same test sets.

Files: the JSON result (rewritten atomically after every checkpoint), a markdown table and a PNG
plot beside it (`research.studies.atomic_report`), and ``<name>-state/<k>/<method>/``: the state each method saved after checkpoint k
(TokMem's bank, LoRA's adapter and replay buffer).  ``resume`` skips the finished checkpoints; in the
sequential schedule it restores the saved states, and rebuilds a method that saves none (Base, RAG) by
learning the finished tasks again.  The settings and presets: `research.studies.atomic_config`.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict
from pathlib import Path

from tqdm.auto import tqdm

from tokmem.data.procedures import Example
from tokmem.data.sni import Task, load_tasks
from tokmem.errors import TokMemError
from tokmem.eval import metrics
from tokmem.io import write_json_atomic, write_text_atomic
from research.methods.base import Base
from research.methods.lora import LoRA, Replay, ReplaySettings
from research.methods.method import Answer, Method
from research.methods.rag import RAG
from research.methods.tokmem import TokMem
from tokmem.report import machine
from research.studies.atomic_config import AtomicConfig
from research.studies.atomic_report import ATOMIC, EFFICIENCY, Study, markdown, plot, summary_line
from research.studies.harness import (
    MethodResult,
    answer_all,
    config_settings,
    learn_round,
    progress_bar,
    resumed_run,
    run_repeats,
)

SCORE_KEYS = ("checkpoints", "budgets")  # where a result's scores are (averaged over seeds)


def build_methods(config: AtomicConfig, backbone) -> list[Method]:
    train, decode, lora = config.train(), config.decode(), config.lora()
    replay = ReplaySettings(config.replay_ratio, config.replay_buffer, config.replay_every)
    factories = {
        "base": lambda: Base(backbone, decode),
        "rag": lambda: RAG(backbone, config.rag_k, decode),
        "lora": lambda: LoRA(backbone, train, lora, decode),
        "replay": lambda: Replay(backbone, replay, train=train, lora=lora, decode=decode),
        "tokmem": lambda: TokMem(backbone, train, decode),
        "tokmem-dc": lambda: TokMem(backbone, train, decode, decoupled=True),
    }
    return [factories[name]() for name in config.methods]


def run(
    config: AtomicConfig, backbone=None, json_path=None, out_dir=None, resume: bool = False, progress: bool = True
) -> dict:
    """The atomic-recall study, or its sample-efficiency variant when ``config.sample_efficiency``; with several seeds
    or budgets, once per seed and budget (``harness.run_repeats``: each run resumes where it stopped)."""
    study = run_sample_efficiency if config.sample_efficiency else run_atomic
    if not config.repeated():
        return study(config, backbone, json_path, out_dir, resume, progress)
    if json_path is None:
        raise TokMemError("several seeds or budgets need a result file (--json): each run is saved beside it")
    backbone = backbone or _load_backbone(config)
    files, kind = Files(json_path, out_dir), EFFICIENCY if config.sample_efficiency else ATOMIC

    def write(result: dict) -> None:
        write_json_atomic(files.json, result)
        write_text_atomic(files.markdown, markdown(result, kind))
        plot(result, kind, files.plot)

    return run_repeats(
        config, lambda one, path: study(one, backbone, path, None, True, progress), json_path, SCORE_KEYS, write
    )


def run_atomic(
    config: AtomicConfig, backbone=None, json_path=None, out_dir=None, resume: bool = False, progress: bool = True
) -> dict:
    config = config.resolved()
    tasks, skipped = load_tasks(
        config.tasks_dir, config.num_tasks, config.train_per_task, config.test_per_task, config.min_train_per_task
    )
    _check_checkpoints(config, len(tasks))
    files = Files(json_path, out_dir)
    result = _start(config, ATOMIC, tasks, skipped, files, resume)
    todo = [n for n in config.checkpoints if n not in {point["num_tasks"] for point in result["checkpoints"]}]
    if todo:
        schedule = _joint if config.task_schedule == "joint" else _sequential
        schedule(config, backbone or _load_backbone(config), tasks, todo, result, files, progress)
    return result


def _sequential(
    config: AtomicConfig, backbone, tasks: list[Task], todo: list[int], result: dict, files, progress: bool
) -> None:
    """One round per task, in order; every method is asked after each checkpoint's last task."""
    methods = build_methods(config, backbone)
    start = result["checkpoints"][-1]["num_tasks"] if result["checkpoints"] else 0
    _restore(methods, tasks[:start], config.query, files.state(start) if start else None, progress)
    rounds, last = [], start
    for n in todo:
        rounds.append((sum(len(t.train) for t in tasks[last:n]), tasks[:n], tasks[:last]))
        last = n
    bar = progress_bar(progress)
    for n in todo:
        previous = _previous(result)
        point = {"num_tasks": n, "methods": {}}
        for method in methods:
            seconds = sum(learn_round(method, t.examples(query=config.query), t.name, bar) for t in tasks[start:n])
            point["methods"][method.name] = evaluate(
                method, tasks[:n], config.eval_batch_size, bar, seconds, _reuse(method, previous), config.query
            )
            if files.json:
                method.save(files.state(n) / method.name)
        start = n
        _finish_point(result, ATOMIC, point, files, bar)
    bar.close()


def _joint(
    config: AtomicConfig, backbone, tasks: list[Task], todo: list[int], result: dict, files, progress: bool
) -> None:
    """One run per checkpoint: fresh methods learn its tasks' examples shuffled together, then are asked."""
    bar = progress_bar(progress)
    for n in todo:
        examples = [e for t in tasks[:n] for e in t.examples(query=config.query)]
        state = files.state(n) if files.json else None
        scores = _fresh_round(
            config, backbone, examples, tasks[:n], f"{n} tasks jointly", bar, _previous(result), state
        )
        _finish_point(result, ATOMIC, {"num_tasks": n, "methods": scores}, files, bar)
    bar.close()


def run_sample_efficiency(
    config: AtomicConfig, backbone=None, json_path=None, out_dir=None, resume: bool = False, progress: bool = True
) -> dict:
    config = config.resolved()
    tasks, skipped = load_tasks(
        config.tasks_dir, config.num_tasks, max(config.budgets), config.test_per_task, min(config.budgets)
    )
    available = min(len(t.train) for t in tasks) if tasks else 0
    budgets = [b for b in config.budgets if b <= available]
    if not budgets:
        raise TokMemError(
            f"no task in {config.tasks_dir} has {min(config.budgets)} training examples after its {config.test_per_task} test examples"
        )
    files = Files(json_path, out_dir)
    result = _start(config, EFFICIENCY, tasks, skipped, files, resume)
    result["dropped_budgets"] = [b for b in config.budgets if b > available]
    todo = [b for b in budgets if b not in {point["train_per_task"] for point in result["budgets"]}]
    if not todo:
        return result
    backbone = backbone or _load_backbone(config)
    bar = progress_bar(progress)
    for budget in todo:
        examples = [e for task in tasks for e in task.examples(task.train[:budget], config.query)]
        scores = _fresh_round(
            config, backbone, examples, tasks, f"{len(tasks)} tasks × {budget}", bar, _previous(result, EFFICIENCY)
        )
        _finish_point(result, EFFICIENCY, {"train_per_task": budget, "methods": scores}, files, bar)
    bar.close()
    return result


def _fresh_round(
    config: AtomicConfig,
    backbone,
    examples: list[Example],
    tasks: list[Task],
    what: str,
    bar,
    previous: dict,
    state: Path | None = None,
) -> dict:
    """Every method built afresh learns ``examples``, shuffled together, in one round, then is asked the test
    queries of ``tasks`` (a method that learns nothing keeps its ``previous`` scores); saves each under ``state``."""
    mixture = list(examples)
    random.Random(f"{config.seed}:{what}").shuffle(mixture)
    scores = {}
    for method in build_methods(config, backbone):
        seconds = learn_round(method, mixture, what, bar)
        scores[method.name] = evaluate(
            method, tasks, config.eval_batch_size, bar, seconds, _reuse(method, previous), config.query
        )
        if state:
            method.save(state / method.name)
    return scores


def _previous(result: dict, study: Study = ATOMIC) -> dict:
    """The methods' scores at the last finished point."""
    points = result[study.key]
    return points[-1]["methods"] if points else {}


def _reuse(method: Method, previous: dict) -> dict:
    """Earlier per-task scores a method may keep: those of a method whose answers never change."""
    return {} if method.learns else previous.get(method.name, {}).get("per_task", {})


# ---- setting up and resuming ----------------------------------------------------------------------------
class Files:
    """Where a study writes: the JSON, then ``<stem>.md``, ``<stem>.png`` and ``<stem>-state/`` in ``out_dir``
    (default: beside the JSON).  Without a JSON path nothing is written."""

    def __init__(self, json_path=None, out_dir=None):
        self.json = Path(json_path) if json_path else None
        folder = Path(out_dir) if out_dir else (self.json.parent if self.json else None)
        stem = self.json.stem if self.json else "atomic"
        self.markdown = folder / f"{stem}.md" if folder else None
        self.plot = folder / f"{stem}.png" if folder else None
        self._state = folder / f"{stem}-state" if folder else None

    def state(self, point: int) -> Path:
        return self._state / str(point)


def _load_backbone(config: AtomicConfig):
    from tokmem.backbones import load_backbone

    return load_backbone(config.backbone, device=config.device)


def _check_checkpoints(config: AtomicConfig, available: int) -> None:
    beyond = [n for n in config.checkpoints if n > available]
    if beyond:
        raise TokMemError(
            f"checkpoint {beyond[0]} needs {beyond[0]} tasks, but {config.tasks_dir} has {available} usable "
            f"English tasks with {config.test_per_task} test + {config.train_per_task} training instances "
            "(lower --checkpoints or the per-task sizes)"
        )


def _start(
    config: AtomicConfig, study: Study, tasks: list[Task], skipped: list[dict], files: Files, resume: bool
) -> dict:
    """The result so far: the saved JSON when resuming (its settings must match), else a fresh one."""
    saved = resumed_run(config, files.json if resume else None, study.title)
    if saved is not None:
        return saved
    return {
        "study": study.title,
        "config": config_settings(config),
        "machine": machine(),
        "tasks": [_task_entry(t) for t in tasks],
        "skipped_tasks": skipped,
        study.key: [],
    }


def _task_entry(task: Task) -> dict:
    entry = {"name": task.name, "train": len(task.train), "test": len(task.test)}
    return entry | ({"unknown_languages": list(task.unknown_languages)} if task.unknown_languages else {})


def _restore(methods: list[Method], seen: list[Task], query: str, directory: Path | None, progress: bool) -> None:
    """Bring every method to where the last finished checkpoint left it: load its saved state, or learn the seen tasks again."""
    for method in methods:
        if seen and not method.load(directory / method.name):
            for task in tqdm(seen, desc=f"{method.name}: rebuilding", disable=not progress, leave=False):
                method.learn(task.examples(query=query))


# ---- learning and answering ----------------------------------------------------------------------------
def evaluate(
    method: Method,
    tasks: list[Task],
    batch_size: int = 16,
    bar=None,
    train_seconds: float = 0.0,
    reuse: dict | None = None,
    query: str = "definition",
) -> dict:
    """Ask every test query of ``tasks`` as the ``query`` mode's user turn (tasks in ``reuse`` keep their earlier
    scores) and score the answers.

    Scores are averaged per task, then over tasks; ``Answer.choice`` is right when it names the query's task.
    """
    start = time.perf_counter()
    reuse = reuse or {}
    bar = bar if bar is not None else progress_bar(False)
    todo = [t for t in tasks if t.name not in reuse]
    queries = [t.query(i, query) for t in todo for i in t.test]
    bar.phase(f"{method.name}: answering {len(tasks)} tasks", len(queries))
    answers = answer_all(method, queries, batch_size, bar)
    scores, first = {}, 0
    for task in todo:
        scores[task.name] = _task_scores(method, task, answers[first : first + len(task.test)])
        first += len(task.test)
    per_task = {t.name: reuse[t.name] if t.name in reuse else scores[t.name] for t in tasks}
    out = asdict(MethodResult.of(method, start)) | {"rougeL": metrics.mean(s["rougeL"] for s in per_task.values())}
    if method.choice_metric:
        out[method.choice_metric] = metrics.mean(s[method.choice_metric] for s in per_task.values())
    return out | {"train_seconds": round(train_seconds, 2), "per_task": per_task}


def _task_scores(method: Method, task: Task, answers: list[Answer]) -> dict:
    """ROUGE-L against each instance's first output (and the choice accuracy) over one task's test instances, plus its
    first answer to read."""
    scores = {"rougeL": metrics.mean(metrics.rouge_l(a.text, i.reference) for a, i in zip(answers, task.test))}
    if method.choice_metric:
        scores[method.choice_metric] = metrics.routing_accuracy([a.choice for a in answers], [task.name] * len(answers))
    return scores | {"first_answer": answers[0].text if answers else None}


# ---- outputs -------------------------------------------------------------------------------------------
def _finish_point(result: dict, study: Study, point: dict, files: Files, bar) -> None:
    result[study.key].append(point)
    bar.write(summary_line(study, point))
    if files.json:
        write_json_atomic(files.json, result)
        write_text_atomic(files.markdown, markdown(result, study))
        plot(result, study, files.plot)
