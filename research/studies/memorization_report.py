"""The memorisation study's outputs: the paper's table and the perplexity curves, beside the JSON
(`research.studies.memorization` runs the study)."""

from __future__ import annotations

from pathlib import Path

from tokmem.io import write_json_atomic, write_text_atomic
from research.studies.outputs import Panel, line_plot, markdown_table
from research.studies.placement import LABELS, METHODS


def markdown(result: dict) -> str:
    """The paper's memorisation table layout: per text size, Steps@90%Best and PPL, one row per method."""
    config, sizes = result["config"], list(result["memorization"])
    header = ["Method"] + [f"{s} tokens: {column}" for s in sizes for column in ("Steps@90%Best ↓", "PPL ↓")]
    rows = [
        [f"{LABELS[method]}-{n}"] + [cell for s in sizes for cell in _cells(result["memorization"][s][f"{method}-{n}"])]
        for n in config["memory_tokens"]
        for method in METHODS
    ]
    rows.append(
        ["Backbone, no memory"]
        + [cell for s in sizes for cell in ("–", f"{result['ppl_before_by_text_tokens'][s]:.2f}")]
    )
    note = (
        f"Memorisation on {config['backbone']}: final perplexity and Steps@90%Best (evaluated every "
        f"{config['eval_every']} of {config['steps']} steps), mean of {len(config['seeds'])} seeds.\n\n"
    )
    return note + markdown_table(header, rows)


def _cells(entry: dict) -> tuple[str, str]:
    return f"{entry['steps_at_90']:.0f}", f"{entry['ppl']:.2f}"


def plot(result: dict, path) -> Path:
    """Mean perplexity vs training steps, one panel per text size, one line per method and token budget."""
    panels = []
    for size, methods in result["memorization"].items():
        panel = Panel(f"{size} text tokens", "training step", "perplexity")
        for n in result["config"]["memory_tokens"]:
            for method in METHODS:
                curve = methods[f"{method}-{n}"]["curve"]
                panel.series[f"{LABELS[method]}-{n}"] = (curve["steps"], curve["ppl"], None)
        panels.append(panel)
    return line_plot(path, panels)


def outputs(json_path) -> list[Path]:
    """The files the study writes: its plot (.png), its JSON and its markdown table (.md beside it)."""
    json_path = Path(json_path)
    return [json_path.with_suffix(".png"), json_path, json_path.with_suffix(".md")]


def write_outputs(result: dict, json_path) -> None:
    """Write the study's ``outputs``."""
    png, json, table = outputs(json_path)
    plot(result, png)
    write_json_atomic(json, result)
    write_text_atomic(table, markdown(result))
