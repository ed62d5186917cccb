"""Outputs every study writes beside its JSON (`tokmem.io.write_json_atomic`): markdown
tables in the paper's layout (methods × settings) and line plots (matplotlib, Agg backend).  A score is a
number, or over several seeds ``{"avg", "sd", "per_seed"}`` (`research.studies.harness.aggregate_seeds`):
tables print it as mean ± sd, plots draw its mean with the sd as an error bar."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


def mean_of(value) -> float:
    """A score as a number: itself, or the mean of a score over seeds (``{"avg", "sd", "per_seed"}``)."""
    return value["avg"] if isinstance(value, dict) else value


def spread(value, fmt: str = "{:.1f}") -> str:
    """A score as a table prints it: the number, or over seeds "mean ± sd" (a single seed's score has no spread to
    print: the number)."""
    if isinstance(value, dict) and len(value["per_seed"]) > 1:
        return f"{fmt.format(value['avg'])} ± {fmt.format(value['sd'])}"
    return fmt.format(mean_of(value))


def scaled(value, factor: float):
    """A score times ``factor`` (a fraction as a percentage), over seeds too."""
    if isinstance(value, dict):
        return {
            "avg": value["avg"] * factor,
            "sd": value["sd"] * factor,
            "per_seed": [v * factor for v in value["per_seed"]],
        }
    return value * factor


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub markdown table; the first column left-aligned, the others right-aligned."""
    align = [":--"] + ["--:"] * (len(header) - 1)
    lines = [header, align, *rows]
    return "\n".join("| " + " | ".join(str(cell) for cell in line) + " |" for line in lines) + "\n"


def pivot_table(
    series: dict[str, dict],
    columns: list,
    corner: str = "Method",
    fmt: str = "{:.1f}",
    average: bool = False,
    extra: dict[str, dict[str, str]] | None = None,
) -> str:
    """Rows = series (label → {column: value}), columns in the given order, an optional average column
    (over the columns the row has) and extra columns ({column title: {row label: text}}).  Missing values print as –."""
    extra = extra or {}
    header = [corner, *map(str, columns)] + (["Avg."] if average else []) + list(extra)
    rows = []
    for label, values in series.items():
        present = [mean_of(values[c]) for c in columns if values.get(c) is not None]
        row = [label, *(spread(values[c], fmt) if values.get(c) is not None else "–" for c in columns)]
        if average:
            row.append(fmt.format(sum(present) / len(present)) if present else "–")
        rows.append(row + [texts.get(label, "–") for texts in extra.values()])
    return markdown_table(header, rows)


def sd_of(value) -> float:
    """A score's spread over seeds (0 for a plain number: one run)."""
    return value["sd"] if isinstance(value, dict) else 0.0


def lines(series: dict[str, dict]) -> dict[str, tuple[list, list, list]]:
    """Series given as label → {x: y} (y a number or a score over seeds), as a Panel takes them: label → (xs,
    the means, the sds)."""
    return {
        label: (list(values), [mean_of(y) for y in values.values()], [sd_of(y) for y in values.values()])
        for label, values in series.items()
    }


@dataclass
class Panel:
    title: str
    xlabel: str
    ylabel: str
    series: dict[str, tuple[list, list, list | None]] = field(default_factory=dict)  # label → (xs, ys, sds or None)
    logx: bool = False
    ylim: tuple[float, float | None] | None = None  # None: matplotlib picks the top


def line_plot(path, panels: list[Panel], columns: int | None = None) -> Path:
    """Line charts (one per panel, ``columns`` to a row; default: one row), a marker and an x tick on every
    point, an error bar where a series' sds are not all 0 (several seeds), saved as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = columns or len(panels)
    rows = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5.5 * columns, 4 * rows), squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.set_axis_off()
    for ax, panel in zip(axes.flat, panels):
        for label, (xs, ys, sds) in panel.series.items():
            if sds and any(sds):  # several seeds: their sd as error bars
                ax.errorbar(xs, ys, yerr=sds, marker="o", capsize=3, label=label)
            else:
                ax.plot(xs, ys, marker="o", label=label)
        if panel.logx:
            ax.set_xscale("log")
        xs = sorted({x for xs, *_ in panel.series.values() for x in xs})
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


# ---- several seeds and budgets (`research.studies.harness.run_repeats`) -------------------------------------------
Headline = Callable[[dict], dict[str, dict]]  # a study's result → label → {"updates": …, score: value} of its headline


def budget_markdown(result: dict, headline: Headline, scores: dict[str, str], body: Callable[[dict], str]) -> str:
    """The budget curve (each method's headline ``scores`` and updates at every budget), then the study's own tables
    (``body``) at each budget."""
    budgets = result["epoch_budgets"]
    curve: dict[str, dict] = {}
    for epochs, point in budgets.items():
        for label, values in headline(point).items():
            curve.setdefault(label, {})[epochs] = f"{values['updates']:,} upd.: " + " / ".join(
                spread(values[m]) for m in scores
            )
    rows = [[label, *(cells.get(e, "–") for e in budgets)] for label, cells in curve.items()]
    columns = [f"{e} epoch(s) each{_seeds_run(point, result['seeds'])}" for e, point in budgets.items()]
    out = (
        "# Budget curve\n\nEvery trained method of a run trains the same epochs over the same data, so the same "
        f"number of updates; one run per budget and seed (seeds {', '.join(map(str, result['seeds']))}); past the "
        "first budget only the methods that train run again (the others answer the same at every budget). Each cell: "
        f"updates: {' / '.join(scores.values())} (mean ± sd over the seeds).\n\n"
        + markdown_table(["Method", *columns], rows)
    )
    for column, point in zip(columns, budgets.values()):
        out += f"\n# At {column}\n\n" + _without_title(body(point))
    return out


def _seeds_run(point: dict, seeds: list[int]) -> str:
    """What a budget's column adds when it has fewer seeds than asked for (a stopped command): which it has."""
    done = point.get("seeds", seeds)
    if done == seeds:
        return ""
    return f" (seed{'s' * (len(done) > 1)} {', '.join(map(str, done))} of {', '.join(map(str, seeds))})"


def _without_title(text: str) -> str:
    """A study's markdown under another title: its own title dropped, its sections a level down."""
    return text.split("\n", 1)[1].lstrip("\n").replace("\n# ", "\n## ")


def budget_panels(result: dict, headline: Headline, scores: dict[str, str], ylabel: str) -> list[Panel]:
    """Each headline score against the updates, one line per trained method (from the same runs as the tables)."""
    series: dict[str, dict[str, dict]] = {m: {} for m in scores}
    for point in result["epoch_budgets"].values():
        for label, values in headline(point).items():
            for metric in scores if values["updates"] else ():
                series[metric].setdefault(label, {})[values["updates"]] = values[metric]
    return [Panel(title, "optimiser updates", ylabel, lines(series[m]), ylim=(0, 100)) for m, title in scores.items()]
