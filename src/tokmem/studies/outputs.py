"""Outputs every study writes beside its JSON (`tokmem.io.write_json_atomic`): markdown
tables in the paper's layout (methods × settings) and line plots (matplotlib, Agg backend)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub markdown table; the first column left-aligned, the others right-aligned."""
    align = [":--"] + ["--:"] * (len(header) - 1)
    lines = [header, align, *rows]
    return "\n".join("| " + " | ".join(str(cell) for cell in line) + " |" for line in lines) + "\n"


def pivot_table(
    series: dict[str, dict], columns: list, corner: str = "Method", fmt: str = "{:.1f}",
    average: bool = False, extra: dict[str, dict[str, str]] | None = None,
) -> str:
    """Rows = series (label → {column: value}), columns in the given order, an optional average column
    (over the columns the row has) and extra columns ({column title: {row label: text}}).  Missing values print as –."""
    extra = extra or {}
    header = [corner, *map(str, columns)] + (["Avg."] if average else []) + list(extra)
    rows = []
    for label, values in series.items():
        present = [values[c] for c in columns if values.get(c) is not None]
        row = [label, *(fmt.format(values[c]) if values.get(c) is not None else "–" for c in columns)]
        if average:
            row.append(fmt.format(sum(present) / len(present)) if present else "–")
        rows.append(row + [texts.get(label, "–") for texts in extra.values()])
    return markdown_table(header, rows)


def lines(series: dict[str, dict]) -> dict[str, tuple[list, list]]:
    """Series given as label → {x: y}, as a Panel takes them: label → (xs, ys)."""
    return {label: (list(values), list(values.values())) for label, values in series.items()}


@dataclass
class Panel:
    title: str
    xlabel: str
    ylabel: str
    series: dict[str, tuple[list, list]] = field(default_factory=dict)  # label → (xs, ys)
    logx: bool = False
    ylim: tuple[float, float | None] | None = None  # None: matplotlib picks the top


def line_plot(path, panels: list[Panel], columns: int | None = None) -> Path:
    """Line charts (one per panel, ``columns`` to a row; default: one row), a marker and an x tick on every
    point, saved as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = columns or len(panels)
    rows = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5.5 * columns, 4 * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_axis_off()
    for ax, panel in zip(axes.flat, panels):
        for label, (xs, ys) in panel.series.items():
            ax.plot(xs, ys, marker="o", label=label)
        if panel.logx:
            ax.set_xscale("log")
        xs = sorted({x for xs, _ in panel.series.values() for x in xs})
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xticks([], minor=True)
        if panel.ylim:
            ax.set_ylim(*panel.ylim)
        ax.set(title=panel.title, xlabel=panel.xlabel, ylabel=panel.ylabel)
        ax.grid(alpha=0.3)
        if panel.series:
            ax.legend()
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
