"""Evaluation metrics: answer matching, ROUGE-L, routing, tool calls, GSM8K answers and perplexity.

Plain Python over strings and floats, so importing this module stays cheap (no torch; ``rouge_score``
is imported on the first ROUGE-L call).
"""

import ast
import json
import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache

from tokmem.data.gsm8k import extract_final_number


def mean(values: Iterable[float]) -> float:
    """Arithmetic mean; 0.0 for no values."""
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def normalize_answer(text: str) -> str:
    """Strip the ends and collapse every run of internal whitespace to one space."""
    return " ".join(text.split())


def exact_match(prediction: str, reference: str) -> float:
    """1.0 when the two answers are equal after `normalize_answer`, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(reference))


@cache
def _rouge_scorer():
    from rouge_score import rouge_scorer

    # The configuration of Super-Natural Instructions' evaluation for English tasks.
    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)


def rouge_l(prediction: str, references: str | Sequence[str]) -> float:
    """ROUGE-L F-measure on a 0-100 scale, the best over the references (as Super-Natural Instructions scores).

    Uses the `rouge_score` default English tokenizer with Porter stemming; text without any
    tokens (an empty prediction, say) scores 0.
    """
    if isinstance(references, str):
        references = [references]
    if not references:
        raise ValueError("rouge_l needs at least one reference")
    scorer = _rouge_scorer()
    return 100.0 * max(scorer.score(reference, prediction)["rougeL"].fmeasure for reference in references)


def routing_accuracy(predicted: Sequence[str | None], gold: Sequence[str]) -> float:
    """Fraction of routing decisions that picked the gold procedure (None, no pick, counts wrong)."""
    if len(predicted) != len(gold):
        raise ValueError(f"{len(predicted)} predictions for {len(gold)} gold items")
    return mean([p == g for p, g in zip(predicted, gold)])


def multiset_f1(predicted: Iterable, gold: Iterable) -> float:
    """F1 of the multiset overlap of two collections, in [0, 1]; 1.0 when both are empty."""
    predicted, gold = Counter(predicted), Counter(gold)
    size = predicted.total() + gold.total()
    if size == 0:
        return 1.0
    return 2 * (predicted & gold).total() / size


@dataclass(frozen=True)
class Boolean:
    """A canonical boolean argument: unlike ``True``, it is not equal to the integer 1."""

    value: bool


def _canonical(value):
    if isinstance(value, bool):
        return Boolean(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return tuple(sorted(((_canonical(k), _canonical(v)) for k, v in value.items()), key=repr))
    if isinstance(value, (list, tuple)):
        return tuple(_canonical(item) for item in value)
    if isinstance(value, (set, frozenset)):
        return frozenset(_canonical(item) for item in value)
    return value


def _load_literal(text: str):
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def parse_call(text: str) -> tuple | None:
    """Parse a tool call ``{"name": ..., "arguments": {...}}`` into a hashable ``(name, arguments)``.

    Accepts strict JSON, then Python-literal style (single quotes, ``True``).  The arguments are
    canonical: key order and spacing do not matter, integral floats become ints (1.0 == 1), lists
    become tuples, and booleans are wrapped in `Boolean` so True never equals 1.  Returns None,
    never raises, when the text is not such a call.
    """
    call = _load_literal(text.strip())
    if not isinstance(call, dict):
        return None
    name, arguments = call.get("name"), call.get("arguments")
    if not isinstance(name, str) or not isinstance(arguments, dict):
        return None
    return name, _canonical(arguments)


def gold_calls(texts: Iterable[str]) -> list[tuple]:
    """Gold calls as ``(name, canonical arguments)``; a gold call that does not parse is an error."""
    parsed = []
    for text in texts:
        call = parse_call(text)
        if call is None:
            raise ValueError(f"gold tool call does not parse: {text!r}")
        parsed.append(call)
    return parsed


def read_call(text: str) -> tuple:
    """A predicted call as ``(name, canonical arguments)``, read from its text alone: the one rule of every method.
    A text that is no call gives ``(None, None)``: it names no tool and matches no arguments (TokMem's memory-token
    choice is scored apart, by `routing_f1`)."""
    call = parse_call(text)
    return call if call else (None, None)


def calls_exact_match(predicted: Sequence[str], gold: Sequence[str]) -> float:
    """1.0 when the predicted call texts are the gold calls, in order, compared as parsed calls (``read_call``: JSON
    as objects, so key order and spacing do not matter), else 0.0."""
    return float([read_call(text) for text in predicted] == gold_calls(gold))


def split_calls(text: str) -> list[str]:
    """The calls in a free-text answer: JSON objects one after another, whether on separate lines or run
    together on one; any other non-blank text up to the end of its line is kept as one call (that then
    scores as wrong), but for a markdown code fence (```json, ```): it wraps calls, it is none."""
    decoder = json.JSONDecoder()
    calls, start = [], 0
    while start < len(text):
        if text[start].isspace():
            start += 1
            continue
        try:
            end = decoder.raw_decode(text, start)[1]
        except json.JSONDecodeError:
            end = text.find("\n", start)
            end = len(text) if end < 0 else end
        line = text[start:end].strip()
        if not CODE_FENCE.fullmatch(line):
            calls.append(line)
        start = end
    return calls


CODE_FENCE = re.compile(r"```\w*")


def tool_f1(predicted: Iterable[tuple], gold: Iterable[tuple]) -> float:
    """Multiset F1 over the called tools' names; a call whose name is unknown (None) names no tool."""
    return multiset_f1([name for name, _ in predicted if name is not None], [name for name, _ in gold])


def argument_f1(predicted: Iterable[tuple], gold: Iterable[tuple]) -> float:
    """The paper's argument F1: multiset F1 over the calls' canonical argument objects, whatever the tool's name.
    A prediction whose arguments do not parse (None) counts as predicted and matches nothing."""
    return multiset_f1([arguments for _, arguments in predicted], [arguments for _, arguments in gold])


def call_f1(predicted: Iterable[tuple], gold: Iterable[tuple]) -> float:
    """Strict call F1: multiset F1 over whole calls, name and arguments both right."""
    return multiset_f1(predicted, gold)


def routing_f1(routes: Iterable[str], gold: Iterable[tuple]) -> float:
    """Multiset F1 of the tools a method's memory tokens chose (TokMem's routing) against the gold calls' names."""
    return multiset_f1(routes, [name for name, _ in gold])


CALL_METRICS = {"tool_f1": "Tool F1", "arg_f1": "Argument F1", "call_f1": "Call F1"}


def call_scores(
    gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[tuple]], routes: Sequence[Sequence[str]] | None = None
) -> dict:
    """Tool, argument and call F1 of each query's predicted calls (``read_call``) against its gold call texts:
    ``{"tool_f1": {"2": …, "3": …, "avg": …}, "arg_f1": …, "call_f1": …}``, 0–100, per number of gold calls
    (averaged over those queries), and "avg" the mean over the numbers of calls present (as the paper averages).
    With ``routes`` (each query's memory-token tools), ``routing_f1`` besides, scored the same way."""
    if len(gold) != len(predicted) or (routes is not None and len(routes) != len(gold)):
        raise ValueError(f"{len(predicted)} predictions for {len(gold)} queries")
    functions = {"tool_f1": tool_f1, "arg_f1": argument_f1, "call_f1": call_f1}
    by_calls: dict[int, dict[str, list[float]]] = {}
    for i, (texts, calls) in enumerate(zip(gold, predicted)):
        expected = gold_calls(texts)
        bucket = by_calls.setdefault(len(expected), defaultdict(list))
        for metric, function in functions.items():
            bucket[metric].append(100 * function(calls, expected))
        if routes is not None:
            bucket["routing_f1"].append(100 * routing_f1(routes[i], expected))
    scores = {}
    for metric in [*functions, *(["routing_f1"] if routes is not None else [])]:
        means = {str(n): mean(by_calls[n][metric]) for n in sorted(by_calls)}
        scores[metric] = means | {"avg": mean(means.values())}
    return scores


def call_text_scores(
    gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]], routes: Sequence[Sequence[str]] | None = None
) -> dict:
    """``call_scores`` of predicted call texts, each read by the one rule of every method (``read_call``)."""
    return call_scores(gold, [[read_call(text) for text in texts] for texts in predicted], routes)


def gsm8k_exact_match(prediction: str, reference: str) -> float:
    """1.0 when the prediction's final number equals the reference's (a GSM8K answer ending ``#### n``)."""
    gold = extract_final_number(reference)
    if gold is None:
        raise ValueError(f"GSM8K reference has no '#### <number>' answer: {reference!r}")
    return float(extract_final_number(prediction) == gold)


def perplexity(total_nll: float, num_tokens: int) -> float:
    """exp of the mean negative log-likelihood per token (total_nll in nats)."""
    if num_tokens <= 0:
        raise ValueError(f"perplexity needs at least one token, got num_tokens={num_tokens}")
    return math.exp(total_nll / num_tokens)


def answering_cost(prompt_tokens: int, seconds: float, calls: int) -> dict:
    """What answering cost per gold call due: ``prompt_tokens_per_call`` (the tokens the backbone read before its
    answers: schemas, demonstrations, query, earlier calls and results; TokMem's memory tokens in place of schemas)
    and ``seconds_per_call`` (wall-clock answering time), the same measure for every method (0 for no calls)."""
    return {
        "prompt_tokens_per_call": round(prompt_tokens / max(calls, 1), 1),
        "seconds_per_call": round(seconds / max(calls, 1), 4),
    }
