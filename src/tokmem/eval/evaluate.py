"""Score a model on held-out examples: routing, chaining, exact match and ROUGE-L; tool, argument and call F1
when the examples are tool calls."""

from __future__ import annotations

import math
from collections import defaultdict

from tokmem.eval import metrics
from tokmem.eval.steps import aligned_scores
from tokmem.data.procedures import Example
from tokmem.decoding.decode import DecodeConfig, Generation, Segment, generate
from tokmem.errors import DataError
from tokmem.eval.tool_loop import model_loop
from tokmem.model import TokMemModel


def evaluate(
    model: TokMemModel, examples: list[Example], config: DecodeConfig | None = None, loop: bool = True
) -> dict:
    """Generate an answer for every example and score it.

    routing_accuracy: the first memory token chosen is the first gold procedure (all examples).
    chain_accuracy:   the whole chosen sequence equals the gold sequence (examples with ≥ 2 steps).
    exact_match / rougeL: the generated answer against the gold answer (segments one per line); for tool calls,
                      exact match compares the parsed calls (JSON as objects: key order and spacing do not matter).
    per_procedure:    the same scores for the single-step examples of each procedure.
    calls:            when every gold step is a tool call (``{"name", "arguments"}`` JSON), tool / argument /
                      call F1 of the k-th call made against the k-th gold call (``steps.aligned_scores``, the one
                      rule of every tool-loop result); else None.  ``calls_pooled``: the pooled F1 by number of
                      calls (``metrics.call_scores``: an example's calls as one multiset), secondary.  With ``loop`` (as
                      ``tokmem eval`` runs), examples whose steps carry results run the tool loop end to end
                      (``eval.tool_loop.model_loop``), each call answered with its recorded result; the others, and
                      all with ``loop=False``, are generated whole.
    calls_per_step:   for the examples whose steps carry results, each step's answer (the gold earlier calls and
                      their results in context) against its own gold call (``steps.aligned_scores``: tool / argument
                      / call F1 over the steps and the exact steps, as the tool-loop study scores); else None.
    step_outcomes:    what those per-step answers got wrong (``steps.outcomes``); else None.
    """
    config = config or DecodeConfig()
    tools = are_tool_calls(examples)
    looped = [i for i, e in enumerate(examples) if loop and tools and all(s.result is not None for s in e.steps)]
    looped_scores = model_loop(model, [examples[i] for i in looped], config) if looped else None
    generations = _generations(model, examples, looped, looped_scores, config)
    calls = [[s.text for s in g.trace] for g in generations] if tools else [None] * len(examples)
    for i, sample in zip(looped, looped_scores["samples"] if looped else []):
        calls[i] = sample["end_to_end"]
    routes = _routes(generations, looped, looped_scores)
    rows = [_score(e, g, c, r) for e, g, c, r in zip(examples, generations, calls, routes)]
    chains = [r for r in rows if len(r["gold"]) > 1]
    return {
        "examples": len(rows),
        "routing_accuracy": metrics.mean([r["routed_right"] for r in rows]),
        "exact_match": metrics.mean([r["exact_match"] for r in rows]),
        "rougeL": metrics.mean([r["rougeL"] for r in rows]),
        "chain_examples": len(chains),
        "chain_accuracy": metrics.mean([r["chain_right"] for r in chains]) if chains else None,
        "open_set_fallbacks": sum(not r["routed"] for r in rows),
        "per_procedure": _per_procedure([r for r in rows if len(r["gold"]) == 1]),
        "calls": aligned_scores([[s.response for s in e.steps] for e in examples], calls, routes) if tools else None,
        "calls_pooled": score_calls(examples, calls, routes) if tools else None,
        "calls_per_step": looped_scores["step"] if looped else None,
        "step_outcomes": looped_scores["outcomes"] if looped else None,
        "predictions": rows,
    }


def _generations(model: TokMemModel, examples, looped: list[int], loop: dict | None, config) -> list[Generation]:
    """Each example's whole answer (``generate``).  A bank that shows its tools' schemas answers through
    ``tokmem.chat`` only: every example must run the tool loop, and its answer is the loop's end-to-end calls."""
    if not model.bank.shows_schemas:
        return generate(model, [e.query for e in examples], config)
    if len(looped) < len(examples):
        raise DataError(
            f"{len(examples) - len(looped)} of {len(examples)} examples are not tool calls with a result at every "
            "step: a bank that shows its tools' schemas is evaluated in the tool loop only"
        )
    return [
        Generation(
            e.query, [Segment(metrics.read_call(c)[0], c) for c in s["end_to_end"]], math.nan, bool(s["end_to_end"])
        )
        for e, s in zip(examples, loop["samples"])
    ]


def _routes(generations: list[Generation], looped: list[int], loop: dict | None) -> list[list[str]]:
    """Each example's chosen procedures: its generation's memory tokens, or where it ran the tool loop the tools its
    end-to-end calls name (each call there starts with its tool's memory token)."""
    routes = [[s.procedure for s in g.trace if s.procedure is not None] for g in generations]
    for i, sample in zip(looped, loop["samples"] if loop else []):
        routes[i] = [metrics.read_call(call)[0] for call in sample["end_to_end"]]
    return routes


def _score(example: Example, generation, calls: list[str] | None, predicted: list[str]) -> dict:
    """One example's row; ``calls``: for tool data, the calls it made (its answer's segments, or its tool loop's);
    ``predicted``: the procedures it chose (``_routes``)."""
    gold = example.procedures
    answer = generation.text if calls is None else "\n".join(calls)
    return {
        "id": example.id,
        "query": example.query,
        "gold": gold,
        "predicted": predicted,
        "routed": generation.routed,
        "answer": answer,
        "trace": [[segment.procedure, segment.text] for segment in generation.trace],
        "reference": example.response,
        "routed_right": float(bool(generation.procedures) and generation.procedures[0] == gold[0]),
        "chain_right": float(predicted == gold),
        "exact_match": metrics.exact_match(answer, example.response)
        if calls is None
        else metrics.calls_exact_match(calls, [s.response for s in example.steps]),
        "rougeL": metrics.rouge_l(answer, example.response),
    }


def are_tool_calls(examples: list[Example]) -> bool:
    """Whether every gold step of ``examples`` is a tool call, so that call F1 means something."""
    return bool(examples) and all(metrics.parse_call(step.response) for e in examples for step in e.steps)


def score_calls(examples: list[Example], predictions: list[list[str]], routes: list[list[str]] | None = None) -> dict:
    """Tool, argument and call F1 (``metrics.call_scores``) of predicted call texts against the gold calls: the one
    scoring rule of every method (a call's tool is the name its text gives; a call that does not parse names no tool
    and matches no gold call).  ``routes``: the memory tokens' tools of a method that has them, scored apart as
    ``routing_f1``."""
    return metrics.call_text_scores([[step.response for step in e.steps] for e in examples], predictions, routes)


def _per_procedure(rows: list[dict]) -> dict:
    groups = defaultdict(list)
    for row in rows:
        groups[row["gold"][0]].append(row)
    return {
        name: {
            "examples": len(group),
            "routing_accuracy": metrics.mean([r["routed_right"] for r in group]),
            "exact_match": metrics.mean([r["exact_match"] for r in group]),
            "rougeL": metrics.mean([r["rougeL"] for r in group]),
        }
        for name, group in sorted(groups.items())
    }
