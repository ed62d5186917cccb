"""The compositional studies' outputs: markdown tables in the paper's layout and line plots, beside the JSON."""

from __future__ import annotations

from pathlib import Path

from tokmem.eval import metrics
from tokmem.eval.steps import total_key
from tokmem.io import write_json_atomic, write_text_atomic
from research.studies.compositional import METRICS
from research.studies.compositional_config import STUDIES
from research.studies.outputs import (
    Panel,
    budget_markdown,
    budget_panels,
    line_plot,
    lines,
    markdown_table,
    mean_of,
    pivot_table,
    spread,
)

AVERAGES = {metric: f"{title} (avg.)" for metric, title in METRICS.items()}  # the budget curve's scores


def markdown(result: dict) -> str:
    if result["study"] == "repeats":
        return budget_markdown(result, headline, AVERAGES, markdown)
    writers = {
        "main": main_markdown,
        "generalization": generalization_markdown,
        "forgetting": forgetting_markdown,
        "recipe": recipe_markdown,
    }
    return writers[result["study"]](result)


def plot(result: dict, path) -> Path:
    if result["study"] == "repeats":
        return line_plot(path, budget_panels(result, headline, AVERAGES, "F1"))
    plotters = {
        "main": main_panels,
        "generalization": generalization_panels,
        "forgetting": forgetting_panels,
        "recipe": recipe_panels,
    }
    columns = len(result["methods"]) if result["study"] == "forgetting" else None
    return line_plot(path, plotters[result["study"]](result), columns)


def write_outputs(result: dict, json_path) -> list[Path]:
    """The JSON, its markdown table (.md beside it) and its plot (.png beside it)."""
    json_path = Path(json_path)
    return [
        write_json_atomic(json_path, result),
        write_text_atomic(json_path.with_suffix(".md"), markdown(result)),
        plot(result, json_path.with_suffix(".png")),
    ]


def _note(result: dict) -> str:
    config, data, adaptation = result["config"], result["data"], result["adaptation"]
    calls = ", ".join(f"{c} with {n} calls" for n, c in data["test_by_calls"].items())
    adapted = (
        f" The adaptation phase trained on {adaptation['examples']} queries over {len(adaptation['tools'])} held-out tools."
        if adaptation
        else ""
    )
    train = data["train"]
    if isinstance(train, dict):
        train = f"{'/'.join(map(str, train.values()))} (capped at {'/'.join(train)} calls)"
    if "train_calls" in data:  # real data: how many calls its training records make, and what was left out
        train = f"{train} ({', '.join(f'{c} with {n} calls' for n, c in data['train_calls'].items())})"
        adapted += " Left out: " + "; ".join(f"{n} {why}" for why, n in data["left_out"].items()) + "."
    return (
        f"Backbone `{config['backbone']}`; {len(data['tools'])} tools ({data['source']}); {train} training "
        f"and {data['test']} test queries ({calls}); {_seeds(result)}.{adapted}\n\n{_protocol(config)}\n\n"
        "Tool F1: the tools the calls' texts name, for every method alike (a call that does not parse names "
        "none); argument F1: the paper's, argument objects matched whatever the name; call F1: name and arguments "
        "both right; routing F1: the tools TokMem's memory tokens chose, scored apart. 0–100; Avg. is the mean "
        "over the numbers of calls. In the tool loop each answer is scored against its own step's gold call (F1 over "
        "all steps: a repeat of an earlier call earns nothing); the pooled call F1 (a record's answers as one "
        "multiset, as results before 2026-11-27 were headlined) stands beside it. Prompt tokens / call and s / call: the tokens the backbone read before answering "
        "and the seconds answering took, per gold call (in the tool loop: per step).\n\n"
    )


def _seeds(result: dict) -> str:
    seeds = result.get("seeds")
    if seeds is None:
        return f"seed {result['config']['seed']}"
    return f"seeds {', '.join(map(str, seeds))} (scores: mean ± sd over the seeds; each seed's in the JSON)"


def _protocol(config: dict) -> str:
    """Which protocol the run followed: the reference code's recipe, or which parts of it differ."""
    reference = {"tool_segments": "arguments", "init": "orthogonal", "schedule": "linear", "renorm_every_step": True}
    differs = [f"{k} {config.get(k)}" for k, v in reference.items() if config.get(k, v) != v]
    recipe = (
        "Protocol: the reference code's (arguments-only tool segments, orthogonal rows, warm-up + linear decay, "
        "per-step renormalisation)"
        if not differs
        else "Protocol: ours, differing from the reference code in " + ", ".join(differs)
    )
    return (
        f"{recipe}; batch {config['batch_size']}; every trained method {config['epochs']} epoch(s) over its data: "
        "the same number of updates (column Updates)."
    )


def _calls(scores: dict) -> list[str]:
    return [key for key in _scored(scores)["tool_f1"] if key not in ("avg", "all")]


LOOP_PARTS = {  # the tool loop's two evaluations (tool_loop), each scored by position (eval.steps)
    "step": "Per step: each answer against its own step's gold call (the gold calls and results before it in context)",
    "end_to_end": "End to end: the k-th call the method made on its own against the k-th gold call",
}


def _scored(entry: dict, part: str = "step") -> dict:
    """A method's scores: in the tool loop its ``part`` evaluation's (per step unless said), else its own."""
    return entry.get(part, entry)


def _score_header(calls: list[str]) -> list[str]:
    return [f"{METRICS[m]} {c}" for m in METRICS for c in [*(f"{n} calls" for n in calls), "Avg."]]


def _score_cells(scores: dict, calls: list[str], part: str = "step") -> list[str]:
    scores = _scored(scores, part)
    return [spread(scores[m][c]) if c in scores[m] else "–" for m in METRICS for c in [*calls, "avg"]]


def _params_cell(value) -> str:
    """A method's trainable parameters; over seeds whose data differ in tools (TokMem: a row a tool), their range."""
    if isinstance(value, dict):
        return f"{min(value['per_seed']):,}–{max(value['per_seed']):,}"
    return f"{value:,}"


def _budget_cells(scores: dict, part: str = "step") -> list[str]:
    """The updates a method made and its memory tokens' routing F1 (TokMem; in the tool loop its ``part``
    evaluation's, by position, or pooled where a result older than that kept no choices by step), beside its
    scores."""
    routing = _scored(scores, part).get("routing_f1")
    pooled = scores.get(f"{part}_pooled", {}).get("routing_f1")
    cell = spread(routing[total_key(routing)]) if routing else f"{spread(pooled['avg'])} (pooled)" if pooled else "–"
    return [f"{scores.get('updates', 0):,}", cell]


COST_HEADER = ["Prompt tokens / call", "s / call"]


def _cost_cells(scores: dict) -> list[str]:
    """What answering cost a method per gold call (``metrics.answering_cost``), "–" in a result written before it was kept."""
    formats = {"prompt_tokens_per_call": "{:.0f}", "seconds_per_call": "{:.2f}"}
    return [spread(scores[key], fmt) if key in scores else "–" for key, fmt in formats.items()]


def main_markdown(result: dict) -> str:
    """Table 3: methods (in the paper's order) × (tool, argument, call F1) × number of calls, with the trainable
    parameters and what answering cost; in the tool loop the tables of ``loop_markdown`` instead."""
    methods = [result["methods"][m] for m in STUDIES["main"][1] if m in result["methods"]]
    title = "# Compositional tool calling\n\n" + _note(result)
    if methods and "step" in methods[0]:
        return title + loop_markdown(methods)
    calls = _calls(methods[0]) if methods else []
    header = ["Method", "#Params", "Updates", "Routing F1 Avg.", *COST_HEADER, *_score_header(calls)]
    rows = [
        [
            s["label"],
            _params_cell(s["trainable_params"]),
            *_budget_cells(s),
            *_cost_cells(s),
            *_score_cells(s, calls),
        ]
        for s in methods
    ]
    return title + markdown_table(header, rows)


def loop_markdown(methods: list[dict]) -> str:
    """The tool loop's tables: per step and end to end, each step's answer against its own gold call
    (``eval.steps``: exact steps, tool / argument / call F1 over all steps, the pooled call F1 beside as a secondary
    column), what answering cost (per step: where it was measured), and what the per-step answers got wrong."""
    out = ""
    for part, title in LOOP_PARTS.items():
        if not all(part in s for s in methods):  # a run answered per step only (--no-end-to-end)
            continue
        cost = part == "step"
        header = ["Method", "#Params", "Updates", "Routing F1", *(COST_HEADER if cost else [])]
        header += ["Exact steps", *METRICS.values(), "Call F1 (pooled, avg.)"]
        rows = []
        for s in methods:
            scores, pooled = s[part], s.get(f"{part}_pooled")
            rows.append(
                [
                    s["label"],
                    _params_cell(s["trainable_params"]),
                    *_budget_cells(s, part),
                    *(_cost_cells(s) if cost else []),
                    _exact_cell(scores),
                    *(spread(scores[m]["all"]) if "all" in scores[m] else "–" for m in METRICS),
                    spread(pooled["call_f1"]["avg"]) if pooled else "–",
                ]
            )
        out += f"## {title}\n\n" + markdown_table(header, rows) + "\n"
    return out + outcomes_markdown(methods)


def _exact_cell(scores: dict) -> str:
    """Exact steps of all the steps: "n of N" (over seeds: the mean ± sd of a seed's)."""
    if "exact_steps" not in scores:
        return "–"
    return f"{spread(scores['exact_steps']['all'])} of {mean_of(scores['steps']['all']):.0f}"


def outcomes_markdown(methods: list[dict]) -> str:
    """What each method's per-step answers got wrong (``steps.outcomes``; over seeds: mean ± sd a seed), and how
    many of the right tool's gold values it wrote, by where they could be read."""
    with_outcomes = [s for s in methods if "outcomes" in s]
    if not with_outcomes:
        return ""
    kinds = list(with_outcomes[0]["outcomes"]["steps"])
    sources = list(with_outcomes[0]["outcomes"]["values of the right tool"])
    header = ["Method", *kinds, *(f"values from {w} right" for w in sources)]
    rows = []
    for s in with_outcomes:
        found = s["outcomes"]
        values = found["values of the right tool"]
        rows.append(
            [
                s["label"],
                *(spread(found["steps"][k], "{:.0f}") for k in kinds),
                *(
                    f"{mean_of(values[w]['right']):.0f} of {mean_of(values[w]['right']) + mean_of(values[w]['wrong']):.0f}"
                    for w in sources
                ),
            ]
        )
    return (
        "## What the per-step answers got wrong\n\nEach step's answer against its gold call: exact; another tool; "
        "the right tool with another key set; the right keys with other values; a verbatim repeat of an earlier "
        "call of the record; not a JSON call; no call. Then the right tool's gold values by where they could be "
        "read (the query, the last tool result, an older one, nowhere), and how many the answer had.\n\n"
        + markdown_table(header, rows)
    )


def generalization_markdown(result: dict) -> str:
    """The paper's generalisation table: for each training cap on the number of calls, each method's scores."""
    points = result["train_max_calls"]
    first = next((s for p in points.values() for s in p["methods"].values()), None)
    calls = _calls(first) if first else []
    rows = [
        [
            f"≤ {n} calls ({result['data']['train'][n]} queries)",
            s["label"],
            *_budget_cells(s),
            *_cost_cells(s),
            *_score_cells(s, calls),
        ]
        for n, p in points.items()
        for s in p["methods"].values()
    ]
    header = ["Train maximum calls", "Method", "Updates", "Routing F1 Avg.", *COST_HEADER, *_score_header(calls)]
    return (
        "# Compositional generalisation\n\nTrained on queries with at most the given number of calls; tested on the same "
        "queries for every setting. " + _note(result) + markdown_table(header, rows)
    )


def recipe_markdown(result: dict) -> str:
    """One row per recipe variant and method: average F1s and the seconds it trained."""
    rows = [
        [
            label,
            s["label"],
            *(spread(_scored(s)[m]["avg"]) for m in METRICS),
            spread(s["train_seconds"], "{:.0f}"),
            *_cost_cells(s),
        ]
        for label, point in result["variants"].items()
        for s in point["methods"].values()
    ]
    return (
        "# Training-recipe ablation\n\nEach row changes one option of the configured recipe "
        f"(init {result['config']['init']}, schedule {result['config']['schedule']}, tool segments "
        f"{result['config']['tool_segments']}) at the same budget. Renormalisation is not switched: a single round "
        "has no old rows to take the norm of (the forgetting study measures it). "
        + _note(result)
        + markdown_table(["Variant", "Method", *(f"{t} Avg." for t in METRICS.values()), "Train s", *COST_HEADER], rows)
    )


def recipe_panels(result: dict) -> list[Panel]:
    """Average F1 per variant (numbered in the table's order), one line per method."""
    panels = []
    for metric, title in METRICS.items():
        series: dict[str, dict] = {}
        for k, point in enumerate(result["variants"].values()):
            for scores in point["methods"].values():
                series.setdefault(scores["label"], {})[k] = mean_of(_scored(scores)[metric]["avg"])
        panels.append(
            Panel(
                f"{title} (avg.)", "variant (row of the table, 0 = as configured)", "F1", lines(series), ylim=(0, 100)
            )
        )
    return panels


def _group_series(entry: dict, metric: str) -> dict[str, dict]:
    """ "group g" → {round: the group's score}, and "all seen groups" → {round: their mean}."""
    series: dict[str, dict] = {}
    for point in entry["rounds"]:
        for group, scores in point["groups"].items():
            series.setdefault(f"group {group}", {})[point["round"]] = scores[metric]["avg"]
    rounds = {p["round"]: p["groups"].values() for p in entry["rounds"]}
    return series | {
        "all seen groups": {r: metrics.mean(mean_of(s[metric]["avg"]) for s in seen) for r, seen in rounds.items()}
    }


def forgetting_markdown(result: dict) -> str:
    """Per method and metric: each group's score (rows) after each round (columns); then the new rows' norms."""
    rounds = list(range(1, result["config"]["rounds"] + 1))
    groups_text = "; ".join(f"group {g}: {', '.join(tools)}" for g, tools in enumerate(result["groups"], 1))
    out = f"# Forgetting: tools arriving in {len(rounds)} rounds\n\n{groups_text}.\n\n" + _note(result)
    for metric, title in METRICS.items():
        for entry in result["methods"].values():
            out += f"## {title}: {entry['label']}\n\n" + pivot_table(
                _group_series(entry, metric), rounds, corner="Group \\ round"
            )
            out += "\n"
    norms = _new_rows(result)
    if norms:
        rows = [
            [label, *(f"{mean_of(n['mean']):.3f} ± {mean_of(n['std']):.3f}" for n in per_round)]
            for label, per_round in norms.items()
        ]
        out += "## L2 norm of each round's new memory rows (mean ± std)\n\n" + markdown_table(
            ["Method", *map(str, rounds)], rows
        )
    return out + _first_group_answers(result)


def _first_group_answers(result: dict) -> str:
    """Group 1's first test query as each method answers it after each round: what forgetting looks like."""
    answers = [(e["label"], p["round"], p["samples"]["1"][0]) for e in result["methods"].values() for p in e["rounds"]]
    if not answers:
        return ""
    sample = answers[0][2]
    out = f"\n## Group 1's first test query, answered after each round\n\nQuery: {sample['query']}\n\nGold: {_calls_text(sample['gold'])}\n\n"
    return out + "".join(f"- {label}, round {r}: {_calls_text(a['predicted'])}\n" for label, r, a in answers)


def _calls_text(calls: list[str]) -> str:
    return "; ".join(f"`{c}`" for c in calls) or "(no call)"


def _new_rows(result: dict) -> dict[str, list[dict]]:
    """label → the norms of each round's new memory rows, for the methods that have memory rows."""
    return {
        e["label"]: [p["new_rows"] for p in e["rounds"]]
        for e in result["methods"].values()
        if e["rounds"] and e["rounds"][0]["new_rows"]
    }


def main_panels(result: dict) -> list[Panel]:
    """F1 against the number of calls, one line per method."""
    panels = []
    for metric, title in METRICS.items():
        series = {s["label"]: {int(c): _scored(s)[metric][c] for c in _calls(s)} for s in result["methods"].values()}
        panels.append(Panel(title, "number of calls", "F1", lines(series), ylim=(0, 100)))
    return panels


def generalization_panels(result: dict) -> list[Panel]:
    """Average F1 (2–4 calls) against the training cap on the number of calls, one line per method."""
    panels = []
    for metric, title in METRICS.items():
        series: dict[str, dict] = {}
        for n, point in result["train_max_calls"].items():
            for scores in point["methods"].values():
                series.setdefault(scores["label"], {})[int(n)] = scores[metric]["avg"]
        panels.append(Panel(f"{title} (avg.)", "maximum calls in training", "F1", lines(series), ylim=(0, 100)))
    return panels


def forgetting_panels(result: dict) -> list[Panel]:
    """A row per metric, a panel per method: each group's score over the rounds.  Then the new rows' mean
    norms (the paper finds them inflating round after round without renormalisation)."""
    panels = [
        Panel(f"{entry['label']}: {title}", "round", title, lines(_group_series(entry, metric)), ylim=(0, 100))
        for metric, title in METRICS.items()
        for entry in result["methods"].values()
    ]
    norms = {
        label: {r: mean_of(n["mean"]) for r, n in enumerate(per_round, 1)}
        for label, per_round in _new_rows(result).items()
    }
    if norms:
        panels.append(Panel("New memory rows", "round", "mean L2 norm", lines(norms), ylim=(0, None)))
    return panels


# ---- several seeds and budgets ---------------------------------------------------------------------------------
def headline(result: dict) -> dict[str, dict]:
    """label → {"updates": …, metric: average score} of each method in a study's headline setting: the main table;
    generalisation's largest training cap; the recipe as configured; forgetting's every group after the last round."""
    study = result["study"]
    if study == "forgetting":
        return {
            e["label"]: {"updates": e["rounds"][-1]["updates"], **_all_groups(e["rounds"][-1]["groups"])}
            for e in result["methods"].values()
            if e["rounds"]
        }
    methods = {
        "main": lambda: result["methods"],
        "generalization": lambda: list(result["train_max_calls"].values())[-1]["methods"],
        "recipe": lambda: result["variants"]["as configured"]["methods"],
    }[study]()
    return {
        s["label"]: {"updates": s.get("updates", 0), **{m: _scored(s)[m][total_key(_scored(s)[m])] for m in METRICS}}
        for s in methods.values()
    }


def _all_groups(groups: dict) -> dict:
    return {m: metrics.mean(mean_of(g[m]["avg"]) for g in groups.values()) for m in METRICS}
