"""Human tables (rich) and JSON files for every command that reports numbers."""

from __future__ import annotations

import os
import platform

import torch
from rich.console import Console
from rich.table import Table

from tokmem.backbones import cpu_dtype_note
from tokmem.io import write_json_atomic
from tokmem.version import __version__

console = Console(stderr=False)
error_console = Console(stderr=True, soft_wrap=True)


def machine() -> dict:
    """Where a result was measured: written next to every result."""
    return {
        "tokmem": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "cpu_dtype": cpu_dtype_note(),  # a CPU figure depends on it (bf16 where the CPU multiplies it natively)
    }


def write_json(path, data: dict) -> None:
    console.print(f"[dim]wrote {write_json_atomic(path, data)}[/dim]")


def percent(value) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def print_fallbacks(fallbacks: int, total: int, what: str, more_training: str) -> None:
    """How many of ``total`` queries fell back to the plain backbone (open set: no memory token routed), with a
    warning and the flags that fix it when most did (``more_training``: e.g. ``--epochs 10``)."""
    console.print(f"open-set fallbacks: {fallbacks} of {total} {what} answered by the plain backbone (no memory token)")
    if fallbacks > total / 2:
        console.print(
            f"[yellow]warning: most {what} fall back to the plain backbone: the bank is undertrained. Train again "
            f"with more updates (tokmem train … {more_training}, or a higher --lr), or route more readily "
            "(--threshold 0.3)[/yellow]",
            highlight=False,
        )


def print_restraints(restraints: dict) -> None:
    """Per off-topic set (``tokmem.eval.open_set.restraints``): the share answered in words, and the queries that
    routed instead."""
    for name, found in restraints.items():
        apart = f"; {found['about_the_bank']} that name the bank's words not scored" if found["about_the_bank"] else ""
        console.print(
            f"off-topic '{name}': {found['answered_in_words']} of {found['scored']} answered by the plain backbone, "
            f"no memory token ({percent(found['restraint'])}){apart}",
            highlight=False,
        )
        for routed in found["routed"]:
            console.print(
                f"  [yellow]routed[/yellow] {routed['query'][:80]!r} → {routed['procedure']} "
                f"(memory mass {100 * routed['memory_mass']:.1f}%)",
                highlight=False,
            )


def numbers_table(title: str, columns: tuple[str, ...]) -> Table:
    """A table whose first column names its rows (left) and whose others hold numbers (right)."""
    table = Table(title=title)
    for k, column in enumerate(columns):
        table.add_column(column, justify="right" if k else "left")
    return table


def scores_table(title: str, result: dict) -> Table:
    """Per-procedure routing / exact match / ROUGE-L, then the overall row."""
    table = numbers_table(title, ("procedure", "n", "routing", "exact match", "ROUGE-L"))
    for name, row in result["per_procedure"].items():
        table.add_row(
            name,
            str(row["examples"]),
            percent(row["routing_accuracy"]),
            percent(row["exact_match"]),
            f"{row['rougeL']:.1f}",
        )
    table.add_section()
    table.add_row(
        "[bold]all[/bold]",
        str(result["examples"]),
        percent(result["routing_accuracy"]),
        percent(result["exact_match"]),
        f"{result['rougeL']:.1f}",
    )
    return table


def call_scores_table(title: str, calls: dict) -> Table:
    """Tool / argument / call F1 and the memory tokens' routing F1 where there is one: one row per score, one column
    per number of calls, then the total: pooled F1's mean over the numbers of calls (``metrics.call_scores``) or, for
    scores by position (``eval.steps.aligned_scores``), all steps, with the exact steps counted."""
    from tokmem.eval.metrics import CALL_METRICS
    from tokmem.eval.steps import total_key

    total = total_key(calls["tool_f1"])
    columns = [c for c in calls["tool_f1"] if c != total]
    table = Table(title=title)
    table.add_column("score")
    for column in columns:
        table.add_column(f"{column} calls", justify="right")
    table.add_column("all steps" if total == "all" else "avg", justify="right")
    for metric, name in (CALL_METRICS | {"routing_f1": "Routing F1"}).items():
        if metric in calls:
            table.add_row(name, *(f"{calls[metric][c]:.1f}" for c in [*columns, total]))
    if "exact_steps" in calls:
        table.add_row("Exact steps", *(f"{calls['exact_steps'][c]} of {calls['steps'][c]}" for c in [*columns, total]))
    return table


def outcome_lines(outcomes: dict) -> list[str]:
    """What the per-step answers got wrong (``eval.steps.outcomes``) in a line, then, where some key sets were
    wrong, the keys left out and added (a user's hint: which optional keys the training data should show more)."""
    lines = ["per-step answers: " + ", ".join(f"{kind} {n}" for kind, n in outcomes["steps"].items())]
    keys = {change: by for change, by in outcomes["wrong key sets, by key"].items() if by}
    if keys:
        said = (f"{change} " + ", ".join(f"{key} ({n})" for key, n in by.items()) for change, by in keys.items())
        lines.append("wrong key sets: " + "; ".join(said))
    return lines


def trace_table(title: str, rows: list[dict], limit: int = 6) -> Table:
    table = Table(title=title, show_lines=True)
    for column in ("query", "trace (procedure → segment)", "reference"):
        table.add_column(column, overflow="fold")
    for row in rows[:limit]:
        trace = "\n".join(f"[cyan]{p}[/cyan] → {s}" for p, s in row["trace"]) if row["trace"] else "(nothing)"
        table.add_row(row["query"], trace, row["reference"])
    return table
