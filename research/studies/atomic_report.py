"""The atomic studies' outputs: the paper's tables (methods × settings) and plots, beside the JSON, and the progress
line of each point (`research.studies.atomic` runs the studies)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from research.studies.outputs import Panel, budget_markdown, budget_panels, line_plot, lines, pivot_table, scaled

ACCURACIES = {"retrieval_accuracy": "retrieval", "routing_accuracy": "routing"}


@dataclass
class Study:
    """What distinguishes the two studies in their result and outputs."""

    key: str  # the result's list of points
    x: str  # a point's setting
    xlabel: str
    title: str


ATOMIC = Study("checkpoints", "num_tasks", "Number of tasks", "Atomic recall on SNI")
EFFICIENCY = Study("budgets", "train_per_task", "Training examples per task", "Sample efficiency on SNI")


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
                series.setdefault(scores["label"], {})[point[study.x]] = scaled(scores[metric], scale)
    return series, [point[study.x] for point in points]


def _accuracy_series(result: dict, study: Study) -> dict[str, dict]:
    """ "<method> (routing)" / "<method> (retrieval)" → {setting: accuracy in %}."""
    return {
        f"{label} ({kind})": values
        for metric, kind in ACCURACIES.items()
        for label, values in _series(result, study, metric, 100.0)[0].items()
    }


QUERY_TEXT = {
    "definition": "the task definition, a blank line, the instance input (the paper's protocol)",
    "input": "the instance input alone (the memory token carries the instruction)",
}
SCHEDULE_TEXT = {
    "joint": "joint: one run per checkpoint on its tasks' examples shuffled together (the reference code)",
    "sequential": "sequential: one round per task in task-id order (the paper's text)",
}


def protocol(result: dict, study: Study) -> str:
    """The protocol line of a table: query, schedule, split, scoring, the training recipes and the data."""
    config, tasks = result["config"], result["tasks"]
    short = [f"{t['name']} {t['train']}" for t in tasks if t["train"] < config["train_per_task"]]
    train = f"up to {config['train_per_task']} training" + (
        f" (fewer where the file has fewer: {', '.join(short)})" if short else ""
    )
    sizes = (
        f"{config['test_per_task']} test and {train} examples per task"
        if study is ATOMIC
        else f"{config['test_per_task']} test examples per task"
    )
    unknown = [t["name"] for t in tasks if t.get("unknown_languages")]
    return (
        f"Protocol: query = {QUERY_TEXT[config['query']]}; schedule = {SCHEDULE_TEXT[config['task_schedule']]}; "
        "split = MD5 order of id‖input‖output[0], test first; ROUGE-L against output[0], Porter-stemmed.\n\n"
        f"Training: every trained method {config['epochs']} epoch(s) over its data (the same updates); TokMem lr "
        f"{config['tokmem_lr']:g}, {config['init']} init; fine-tuning LoRA r={config['lora_rank']}, lr {config['lora_lr']:g}; "
        f"{config['schedule']} lr schedule; batch {config['batch_size']}; {_seeds(result)}.\n\n"
        f"Data: backbone `{config['backbone']}`; {len(tasks)} tasks from `{config['tasks_dir']}`; {sizes}"
        + (f"; {len(result['skipped_tasks'])} task file(s) skipped" if result["skipped_tasks"] else "")
        + (f"; kept without language fields (taken as English): {', '.join(unknown)}" if unknown else "")
        + ".\n\n"
    )


def _seeds(result: dict) -> str:
    seeds = result.get("seeds")
    return f"seed {result['config']['seed']}" if seeds is None else f"seeds {', '.join(map(str, seeds))} (mean ± sd)"


def headline(result: dict, study: Study) -> dict[str, dict]:
    """label → {"updates", "rougeL"} of each method at the study's last point (the budget curve's points)."""
    last = result[study.key][-1]["methods"] if result[study.key] else {}
    return {s["label"]: {"updates": s.get("updates", 0), "rougeL": s["rougeL"]} for s in last.values()}


def markdown(result: dict, study: Study) -> str:
    """The paper's tables: ROUGE-L (methods × settings, with the average and the trainable parameters),
    then the routing / retrieval accuracy; the protocol above them.  Several seeds or budgets: the budget curve,
    then these tables at each budget."""
    if result["study"] == "repeats":
        return budget_markdown(
            result, lambda r: headline(r, study), {"rougeL": "ROUGE-L"}, lambda r: markdown(r, study)
        )
    rouge, columns = _series(result, study, "rougeL")
    last = result[study.key][-1]["methods"] if result[study.key] else {}
    params = {s["label"]: f"{s['trainable_params']:,}" for s in last.values()}
    return (
        f"# {study.title}: ROUGE-L\n\n"
        f"Columns: {study.xlabel.lower()}. "
        + protocol(result, study)
        + pivot_table(rouge, columns, average=True, extra={"Trainable params": params})
        + "\n## Routing / retrieval accuracy (%)\n\n"
        + pivot_table(_accuracy_series(result, study), columns)
    )


def plot(result: dict, study: Study, path) -> Path:
    """ROUGE-L against the setting for every method, and TokMem's routing against RAG's retrieval accuracy (several
    seeds or budgets: ROUGE-L at the last point against the updates)."""
    if result["study"] == "repeats":
        return line_plot(path, budget_panels(result, lambda r: headline(r, study), {"rougeL": "ROUGE-L"}, "ROUGE-L"))
    rouge, xs = _series(result, study, "rougeL")
    logx = bool(xs) and max(xs) >= 20 * min(xs)
    return line_plot(
        path,
        [
            Panel("ROUGE-L", study.xlabel, "ROUGE-L", lines(rouge), logx, (0, 100)),
            Panel(
                "Routing vs retrieval accuracy",
                study.xlabel,
                "accuracy (%)",
                lines(_accuracy_series(result, study)),
                logx,
                (0, 100),
            ),
        ],
    )
