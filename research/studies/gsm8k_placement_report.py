"""The GSM8K placement study's outputs: the paper's table beside the JSON (`research.studies.gsm8k_placement` runs the
study)."""

from __future__ import annotations

from pathlib import Path

from tokmem.io import write_json_atomic, write_text_atomic
from research.studies.outputs import markdown_table
from research.studies.placement import LABELS, METHODS

PROTOCOLS = {
    "reference": "the reference layout (`question: …` user turn, TokMem's memory token before the assistant header, "
    "target `answer: …`)",
    "assistant": "the assistant layout (the bare question, TokMem's memory token after the assistant header, the bare solution as target)",
}


def markdown(result: dict) -> str:
    """The paper's GSM8K table layout: per data fraction, both compliances and EM (%) of each method, and the kept epoch."""
    config = result["config"]
    rows = [
        [f"{fraction}%", LABELS[method], *_cells(methods[method], config["epochs"])]
        for fraction, methods in result["gsm8k"].items()
        for method in METHODS
    ]
    note = (
        f"GSM8K on {config['backbone']}, {PROTOCOLS[config['layout']]}: {config['epochs']} epochs at lr {config['lr']:g}, "
        f"the rows of the epoch with the best exact match (ties: compliance) on {result['validation_examples']} held-out "
        f"training problems; {result['train_examples']} training problems (100%), {result['test_examples']} test problems. "
        "Compliance: `#### ` anywhere in the answer (the reference rule); strict: the answer ends with `#### <number>`.\n\n"
    )
    header = ["Data%", "Method", "Compliance ↑", "Strict compliance ↑", "EM ↑", "Kept epoch"]
    return note + markdown_table(header, rows)


def _cells(scores: dict, epochs: int) -> list[str]:
    """Compliance, strict compliance and exact match (%), and the epoch kept."""
    percentages = [f"{100 * scores[key]:.1f}" for key in ("compliance", "strict_compliance", "em")]
    return percentages + [f"{scores['best_epoch']} of {epochs}"]


def outputs(json_path) -> list[Path]:
    """The files the study writes: its JSON and its markdown table (.md beside it)."""
    json_path = Path(json_path)
    return [json_path, json_path.with_suffix(".md")]


def write_outputs(result: dict, json_path) -> None:
    """Write the study's ``outputs``."""
    json, table = outputs(json_path)
    write_json_atomic(json, result)
    write_text_atomic(table, markdown(result))
