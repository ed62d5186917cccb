"""Atomic recall on Super-Natural Instructions: TokMem against Base, RAG, fine-tuning and replay.

Each SNI task is one procedure.  Tasks arrive one at a time in ascending task-id order (every
method learns each task as one round, its examples shuffled); after the first k tasks (a
checkpoint) every method answers the test queries of all k tasks.  A query is the instance input
alone.  Scores: ROUGE-L (0–100, best over an instance's references), averaged per task, then over
tasks; the routing accuracy of TokMem and the retrieval accuracy of RAG (in [0, 1]); the trainable
parameter count of every method.

The sample-efficiency variant trains fresh methods on a mixture of the first 10 tasks (one round)
with 10, 20, 50, … training examples per task, and scores them on the same test sets.

Files: the JSON result (rewritten atomically after every checkpoint), a markdown table and a PNG
plot beside it, and ``<name>-state/<k>/<method>/``: the state each method saved after checkpoint k
(TokMem's bank, LoRA's adapter and replay buffer).  ``resume`` skips the finished checkpoints,
restores the saved states, and rebuilds a method that saves none (Base, RAG) by learning the
finished tasks again.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from tqdm.auto import tqdm

from tokmem import metrics
from tokmem.baselines.base import Base
from tokmem.baselines.common import Answer, Method
from tokmem.baselines.lora import LoRA, Replay
from tokmem.baselines.memory import TokMem
from tokmem.baselines.rag import RAG
from tokmem.data.sni import Task, load_tasks
from tokmem.errors import TokMemError
from tokmem.experiments.outputs import Panel, line_plot, lines, pivot_table, read_json, write_json_atomic, write_text_atomic
from tokmem.experiments.settings import MethodSettings
from tokmem.report import machine

METHODS = ("base", "rag", "lora", "replay", "tokmem", "tokmem-dc")
EFFICIENCY_METHODS = ("rag", "lora", "tokmem", "tokmem-dc")
EFFICIENCY_TASKS = 10
RESUME_IGNORES = ("device", "preset")  # settings a resumed run may change
ACCURACIES = {"retrieval_accuracy": "retrieval", "routing_accuracy": "routing"}


@dataclass(frozen=True)
class AtomicConfig(MethodSettings):
    tasks_dir: str | None = None
    num_tasks: int | None = None  # default: the last checkpoint (10 for sample efficiency)
    train_per_task: int = 500
    test_per_task: int = 50
    checkpoints: tuple[int, ...] = (10, 50, 200, 500, 1000)
    methods: tuple[str, ...] | None = None  # default: METHODS (EFFICIENCY_METHODS for sample efficiency)
    backbone: str = "smollm2-135m"
    lora_rank: int | None = None  # default: 8 (1 for sample efficiency, as the paper)
    rag_k: int = 2
    replay_ratio: float = 0.2
    replay_buffer: int = 500
    replay_every: int = 10
    sample_efficiency: bool = False
    budgets: tuple[int, ...] = (10, 20, 50, 100, 200, 500)  # training examples per task (sample efficiency)

    def resolved(self) -> "AtomicConfig":
        """Fill the settings whose default depends on the study; check the rest."""
        efficiency = self.sample_efficiency
        config = replace(
            self,
            methods=tuple(self.methods or (EFFICIENCY_METHODS if efficiency else METHODS)),
            lora_rank=self.lora_rank or (1 if efficiency else 8),
            num_tasks=self.num_tasks or (EFFICIENCY_TASKS if efficiency else max(self.checkpoints)),
            checkpoints=tuple(sorted(set(self.checkpoints))),
            budgets=tuple(sorted(set(self.budgets))),
        )
        unknown = [m for m in config.methods if m not in METHODS]
        if unknown:
            raise TokMemError(f"unknown method(s) {', '.join(unknown)}: choose from {', '.join(METHODS)}")
        if not config.tasks_dir:
            raise TokMemError("no SNI tasks folder: pass --tasks-dir (e.g. natural-instructions/tasks)")
        if min(config.checkpoints + config.budgets) < 1:
            raise TokMemError("checkpoints and budgets must be positive numbers")
        if not 0.0 <= config.replay_ratio < 1.0:
            raise TokMemError(f"the replay ratio must be at least 0 and below 1, not {config.replay_ratio}")
        return config


PRESETS = {
    # the real SNI files beside the project, smollm2-135m: about 25 minutes on an idle 2-core CPU.  Three epochs
    # (15 steps a task instead of 5) because 20 examples a task are far fewer than the paper's 500.  Sample
    # efficiency trains each method afresh per budget, so its budgets stop at 20 (about as long again).
    "cpu": dict(
        tasks_dir="../shared/data/sni/tasks", backbone="smollm2-135m", train_per_task=20, test_per_task=8,
        checkpoints=(5, 10, 14), epochs=3, max_new_tokens=48, replay_buffer=100, replay_every=5, budgets=(5, 10, 20),
    ),
    # the paper's sizes (1,000 English tasks, 500 train / 50 test each); needs a GPU and the full natural-instructions
    "paper": dict(
        backbone="Qwen/Qwen2.5-0.5B-Instruct", train_per_task=500, test_per_task=50,
        checkpoints=(10, 50, 200, 500, 1000), max_new_tokens=128,
    ),
}


def make_config(preset: str | None = "cpu", **options) -> AtomicConfig:
    """A preset's settings, overridden by every option that is not None."""
    if preset is not None and preset not in PRESETS:
        raise TokMemError(f"unknown preset '{preset}': choose from {', '.join(PRESETS)}")
    settings = {**PRESETS.get(preset, {}), **{k: v for k, v in options.items() if v is not None}}
    return AtomicConfig(preset=preset, **settings)


def build_methods(config: AtomicConfig, backbone) -> list[Method]:
    decode, memory, lora = config.decode_options(), config.tokmem_options(), config.lora_options()
    replay = dict(ratio=config.replay_ratio, buffer_size=config.replay_buffer, refresh_every=config.replay_every)
    factories = {
        "base": lambda: Base(backbone, **decode),
        "rag": lambda: RAG(backbone, k=config.rag_k, **decode),
        "lora": lambda: LoRA(backbone, **lora),
        "replay": lambda: Replay(backbone, **replay, **lora),
        "tokmem": lambda: TokMem(backbone, **memory),
        "tokmem-dc": lambda: TokMem(backbone, decoupled=True, **memory),
    }
    return [factories[name]() for name in config.methods]


@dataclass
class Study:
    """What distinguishes the two studies in their result and outputs."""

    key: str  # the result's list of points
    x: str  # a point's setting
    xlabel: str
    title: str


ATOMIC = Study("checkpoints", "num_tasks", "Number of tasks", "Atomic recall on SNI")
EFFICIENCY = Study("budgets", "train_per_task", "Training examples per task", "Sample efficiency on SNI")


def run(config: AtomicConfig, backbone=None, json_path=None, out_dir=None, resume: bool = False, progress: bool = True) -> dict:
    """The atomic-recall study, or its sample-efficiency variant when ``config.sample_efficiency``."""
    study = run_sample_efficiency if config.sample_efficiency else run_atomic
    return study(config, backbone, json_path, out_dir, resume, progress)


def run_atomic(config: AtomicConfig, backbone=None, json_path=None, out_dir=None, resume: bool = False, progress: bool = True) -> dict:
    config = config.resolved()
    tasks, skipped = load_tasks(config.tasks_dir, config.num_tasks, config.train_per_task, config.test_per_task, config.seed)
    _check_checkpoints(config, len(tasks))
    files = Files(json_path, out_dir)
    result = _start(config, ATOMIC, tasks, skipped, files, resume)
    done = [point["num_tasks"] for point in result["checkpoints"]]
    todo = [n for n in config.checkpoints if n not in done]
    if not todo:
        return result
    methods = build_methods(config, backbone or _load_backbone(config))
    start = done[-1] if done else 0
    _restore(methods, tasks[:start], files.state(start) if start else None, progress)
    bar = progress_bar(_atomic_units(methods, tasks, start, todo), progress)
    for n in todo:
        previous = result["checkpoints"][-1]["methods"] if result["checkpoints"] else {}
        point = {"num_tasks": n, "methods": {}}
        for method in methods:
            seconds = sum(learn_round(method, t.examples(), t.name, bar) for t in tasks[start:n])
            reuse = {} if method.learns else previous.get(method.name, {}).get("per_task", {})
            point["methods"][method.name] = evaluate(method, tasks[:n], config.eval_batch_size, bar, seconds, reuse)
            if files.json:
                method.save(files.state(n) / method.name)
        start = n
        _finish_point(result, ATOMIC, point, files, bar)
    bar.close()
    return result


def run_sample_efficiency(config: AtomicConfig, backbone=None, json_path=None, out_dir=None, resume: bool = False, progress: bool = True) -> dict:
    config = config.resolved()
    tasks, skipped = load_tasks(
        config.tasks_dir, config.num_tasks, max(config.budgets), config.test_per_task, config.seed, min_train=min(config.budgets)
    )
    available = min(len(t.train) for t in tasks) if tasks else 0
    budgets = [b for b in config.budgets if b <= available]
    if not budgets:
        raise TokMemError(f"no task in {config.tasks_dir} has {min(config.budgets)} training examples after its {config.test_per_task} test examples")
    files = Files(json_path, out_dir)
    result = _start(config, EFFICIENCY, tasks, skipped, files, resume)
    result["dropped_budgets"] = [b for b in config.budgets if b > available]
    todo = [b for b in budgets if b not in {point["train_per_task"] for point in result["budgets"]}]
    if not todo:
        return result
    backbone = backbone or _load_backbone(config)
    epochs = sum(m.epochs for m in build_methods(config, backbone))  # passes over a budget's mixture, all methods
    bar = progress_bar(sum(_efficiency_units(config, tasks, b, epochs) for b in todo), progress)
    for budget in todo:
        point = {"train_per_task": budget, "methods": {}}
        for method in build_methods(config, backbone):
            mixture = [e for task in tasks for e in task.examples(task.train[:budget])]
            seconds = learn_round(method, mixture, f"{len(tasks)} tasks × {budget}", bar)
            point["methods"][method.name] = evaluate(method, tasks, config.eval_batch_size, bar, seconds)
        _finish_point(result, EFFICIENCY, point, files, bar)
    bar.close()
    return result


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


def _config_dict(config: AtomicConfig) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(config).items()}


def _start(config: AtomicConfig, study: Study, tasks: list[Task], skipped: list[dict], files: Files, resume: bool) -> dict:
    """The result so far: the saved JSON when resuming (its settings must match), else a fresh one."""
    settings = _config_dict(config)
    if resume and files.json and files.json.is_file():
        result = read_json(files.json)
        changed = [k for k in settings if k not in RESUME_IGNORES and result["config"].get(k) != settings[k]]
        if changed:
            raise TokMemError(
                f"cannot resume {files.json}: it was run with other settings ({', '.join(changed)}); "
                "use the same options, or drop --resume to start over"
            )
        return result
    return {
        "study": study.title,
        "config": settings,
        "machine": machine(),
        "tasks": [{"name": t.name, "train": len(t.train), "test": len(t.test)} for t in tasks],
        "skipped_tasks": skipped,
        study.key: [],
    }


def _restore(methods: list[Method], seen: list[Task], directory: Path | None, progress: bool) -> None:
    """Bring every method to where the last finished checkpoint left it: load its saved state, or learn the seen tasks again."""
    for method in methods:
        if seen and not method.load(directory / method.name):
            for task in tqdm(seen, desc=f"{method.name}: rebuilding", disable=not progress, leave=False):
                method.learn(task.examples())


# ---- learning and answering ----------------------------------------------------------------------------
def progress_bar(total: int, progress: bool):
    """One bar for the whole run: its rate and time left count training examples and test queries alike."""
    return tqdm(total=total, unit="ex", disable=not progress, dynamic_ncols=True, smoothing=0.05)


def _atomic_units(methods, tasks, start, todo) -> int:
    """Work for the progress bar and its time estimate: training examples seen plus test queries answered."""
    units, last = 0, start
    for n in todo:
        for method in methods:
            units += method.epochs * sum(len(t.train) for t in tasks[last:n])
            units += sum(len(t.test) for t in (tasks[:n] if method.learns else tasks[last:n]))
        last = n
    return units


def _efficiency_units(config: AtomicConfig, tasks: list[Task], budget: int, epochs: int) -> int:
    """``epochs``: the methods' passes over the mixture, summed over the methods."""
    return epochs * budget * len(tasks) + len(config.methods) * sum(len(t.test) for t in tasks)


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


def evaluate(method: Method, tasks: list[Task], batch_size: int = 16, bar=None, train_seconds: float = 0.0, reuse: dict | None = None) -> dict:
    """Answer every test query of ``tasks`` (those in ``reuse`` keep their earlier scores) and score them.

    Scores are averaged per task, then over tasks; ``Answer.choice`` is right when it names the query's task.
    """
    start = time.perf_counter()
    reuse = reuse or {}
    bar = bar if bar is not None else tqdm(disable=True)
    todo = [t for t in tasks if t.name not in reuse]
    bar.set_description_str(f"{method.name}: answering {len(tasks)} tasks")
    answers = answer_all(method, [i.input for t in todo for i in t.test], batch_size, bar)
    scores, first = {}, 0
    for task in todo:
        scores[task.name] = _task_scores(method, task, answers[first : first + len(task.test)])
        first += len(task.test)
    per_task = {t.name: reuse[t.name] if t.name in reuse else scores[t.name] for t in tasks}
    out = {"label": method.label, "rougeL": metrics.mean(s["rougeL"] for s in per_task.values())}
    if method.choice_metric:
        out[method.choice_metric] = metrics.mean(s[method.choice_metric] for s in per_task.values())
    return out | {
        "trainable_params": method.trainable_params(),
        "train_seconds": round(train_seconds, 2),
        "eval_seconds": round(time.perf_counter() - start, 2),
        "per_task": per_task,
    }


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


def _task_scores(method: Method, task: Task, answers: list[Answer]) -> dict:
    """ROUGE-L (and the choice accuracy) over one task's test instances, plus its first answer to read."""
    scores = {"rougeL": metrics.mean(metrics.rouge_l(a.text, list(i.outputs)) for a, i in zip(answers, task.test))}
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


def summary_line(study: Study, point: dict) -> str:
    parts = []
    for name, scores in point["methods"].items():
        accuracy = "".join(f" ({kind} {100 * scores[k]:.0f}%)" for k, kind in ACCURACIES.items() if k in scores)
        parts.append(f"{name} {scores['rougeL']:.1f}{accuracy}")
    return f"{study.xlabel.lower()} {point[study.x]}: ROUGE-L " + " | ".join(parts)


def _series(result: dict, study: Study, metric: str, scale: float = 1.0) -> tuple[dict[str, dict], list[int]]:
    """label → {setting: value} for the methods that report ``metric``, and the settings in order."""
    points = result[study.key]
    series: dict[str, dict] = {}
    for point in points:
        for scores in point["methods"].values():
            if metric in scores:
                series.setdefault(scores["label"], {})[point[study.x]] = scale * scores[metric]
    return series, [point[study.x] for point in points]


def _accuracy_series(result: dict, study: Study) -> dict[str, dict]:
    """"<method> (routing)" / "<method> (retrieval)" → {setting: accuracy in %}."""
    return {
        f"{label} ({kind})": values
        for metric, kind in ACCURACIES.items()
        for label, values in _series(result, study, metric, 100.0)[0].items()
    }


def markdown(result: dict, study: Study) -> str:
    """The paper's tables: ROUGE-L (methods × settings, with the average and the trainable parameters),
    then the routing / retrieval accuracy."""
    config = result["config"]
    rouge, columns = _series(result, study, "rougeL")
    last = result[study.key][-1]["methods"] if result[study.key] else {}
    params = {s["label"]: f"{s['trainable_params']:,}" for s in last.values()}
    train = f"{config['train_per_task']} training and " if study is ATOMIC else ""
    return (
        f"# {study.title}: ROUGE-L\n\n"
        f"Columns: {study.xlabel.lower()}. Backbone `{config['backbone']}`; {len(result['tasks'])} tasks from "
        f"`{config['tasks_dir']}`; {train}{config['test_per_task']} test examples per task; {config['epochs']} epoch(s); "
        f"seed {config['seed']}.\n\n"
        + pivot_table(rouge, columns, average=True, extra={"Trainable params": params})
        + "\n## Routing / retrieval accuracy (%)\n\n"
        + pivot_table(_accuracy_series(result, study), columns)
    )


def plot(result: dict, study: Study, path) -> Path:
    """ROUGE-L against the setting for every method, and TokMem's routing against RAG's retrieval accuracy."""
    rouge, xs = _series(result, study, "rougeL")
    logx = bool(xs) and max(xs) >= 20 * min(xs)
    return line_plot(path, [
        Panel("ROUGE-L", study.xlabel, "ROUGE-L", lines(rouge), logx, (0, 100)),
        Panel("Routing vs retrieval accuracy", study.xlabel, "accuracy (%)", lines(_accuracy_series(result, study)), logx, (0, 100)),
    ])

