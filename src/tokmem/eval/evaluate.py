"""Score a model on held-out examples: routing, chaining, exact match and ROUGE-L; tool, argument and call F1
when the examples are tool calls."""

from __future__ import annotations

from collections import defaultdict

from tokmem.eval import metrics
from tokmem.data.procedures import Example
from tokmem.decode import DecodeConfig, Generation, generate
from tokmem.model import TokMemModel


def evaluate(model: TokMemModel, examples: list[Example], config: DecodeConfig | None = None) -> dict:
    """Generate an answer for every example and score it.

    routing_accuracy: the first memory token chosen is the first gold procedure (all examples).
    chain_accuracy:   the whole chosen sequence equals the gold sequence (examples with ≥ 2 steps).
    exact_match / rougeL: the generated answer against the gold answer (segments one per line).
    per_procedure:    the same scores for the single-step examples of each procedure.
    calls:            when every gold step is a tool call (``{"name", "arguments"}`` JSON), tool / argument /
                      call F1 by number of calls (``metrics.call_scores``); else None.
    """
    generations = generate(model, [e.query for e in examples], config)
    rows = [_score(e, g) for e, g in zip(examples, generations)]
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
        "calls": tool_call_scores(examples, generations) if are_tool_calls(examples) else None,
        "predictions": rows,
    }


def _score(example: Example, generation) -> dict:
    predicted, gold = generation.procedures, example.procedures
    return {
        "id": example.id,
        "query": example.query,
        "gold": gold,
        "predicted": predicted,
        "routed": generation.routed,
        "answer": generation.text,
        "trace": [[segment.procedure, segment.text] for segment in generation.trace],
        "reference": example.response,
        "routed_right": float(bool(predicted) and predicted[0] == gold[0]),
        "chain_right": float(predicted == gold),
        "exact_match": metrics.exact_match(generation.text, example.response),
        "rougeL": metrics.rouge_l(generation.text, example.response),
    }


def are_tool_calls(examples: list[Example]) -> bool:
    """Whether every gold step of ``examples`` is a tool call, so that call F1 means something."""
    return bool(examples) and all(metrics.parse_call(step.response) for e in examples for step in e.steps)


def tool_call_scores(examples: list[Example], generations: list[Generation]) -> dict:
    """``score_calls`` of TokMem's generations: each memory-token segment is one call, its memory token a route."""
    return score_calls(
        examples,
        [[s.text for s in g.trace] for g in generations],
        [[s.procedure for s in g.trace if s.procedure is not None] for g in generations],
    )


def predicted_calls(answer) -> list[str]:
    """The call texts of an answer (a ``tokmem.methods.Answer``): TokMem's segments, one call each, or else the
    calls found in the answer's text."""
    if answer.segments is not None:
        return [segment.text for segment in answer.segments]
    return metrics.split_calls(answer.text)


def memory_routes(answer) -> list[str] | None:
    """The tools an answer's memory tokens chose (TokMem), or None for a method without memory tokens."""
    if answer.segments is None:
        return None
    return [segment.procedure for segment in answer.segments if segment.procedure is not None]


def score_calls(examples: list[Example], predictions: list[list[str]], routes: list[list[str]] | None = None) -> dict:
    """Tool, argument and call F1 (``metrics.call_scores``) of predicted call texts against the gold calls: the one
    scoring rule of every method (a call's tool is the name its text gives; a call that does not parse names no tool
    and matches no gold call).  ``routes``: the memory tokens' tools of a method that has them, scored apart as
    ``routing_f1``."""
    calls = [[metrics.read_call(text) for text in predicted] for predicted in predictions]
    return metrics.call_scores([[step.response for step in e.steps] for e in examples], calls, routes)


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
