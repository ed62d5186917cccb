"""A tool loop's answers scored step by step: each answer against the gold call of its own step.

The headline rule of every tool-loop result, for every method: the answer at position k of a record (per step: the
call made with the gold calls 0..k-1 and their results in context; end to end: the k-th call the method made on its
own) is set against gold call k, read as the scorer reads any call (``metrics.read_call``: parsed JSON, canonical
arguments).  Tool, argument and call F1 are micro F1 over the steps: a right answer counts once, a call made
against no gold step (end to end: one too many) lowers precision, a step answered without a call lowers recall.
Unlike the pooled F1 (``metrics.call_scores``, a record's answers as one multiset), a verbatim repeat of an earlier
call earns nothing here.

``outcomes`` says what each per-step answer got wrong (``OUTCOMES``), where a wrong tool stands in the record
(``PLACES``: a later step's tool is a stage skipped, an earlier step's one stayed at), which keys a wrong key set left
out or added (by key: mostly the optional ones a query implies, a sort or a filter), and where each gold value of a
step could be read (``source``: the query, the last result, an older one, nowhere) and whether the answer had it,
and what each wrong value is instead (``value_error``: empty, another key's value, a date shifted, the gold cut short
or run on, another number, another string of the context, or none of these); ``gold_value_sources`` counts the same
sources over a data set's own calls (what it teaches to copy).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from tokmem.data.procedures import Example
from tokmem.eval.metrics import gold_calls, read_call

SCORES = ("tool_f1", "arg_f1", "call_f1")
OUTCOMES = ("exact", "wrong tool", "wrong key set", "wrong values", "repeat", "not a JSON call", "no call")
SOURCES = ("query", "last result", "older result", "none")
PLACES = ("a later step's", "an earlier step's", "not in the record")  # where a wrong tool stands in the record
VALUE_ERRORS = (
    "empty",
    "another key's",
    "date shifted",
    "cut or run on",
    "another number",
    "other text of the context",
    "elsewhere",
)
ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def aligned_scores(
    gold: Sequence[Sequence[str]], answers: Sequence[Sequence[str | None]], routes=None
) -> dict[str, dict[str, float]]:
    """Tool / argument / call F1 (0-100) of each record's answers by position against its gold calls, and
    ``exact_steps`` and ``steps``: ``{metric: {"2": …, "3": …, "all": …}}`` by the records' number of gold calls and
    over all steps.  ``answers[i][k]`` is None where step k got no call (end to end: a list of the calls made, in
    order).  With ``routes`` (the tool each step's memory token chose, aligned the same way; TokMem), ``routing_f1``
    besides."""
    if len(gold) != len(answers) or (routes is not None and len(routes) != len(gold)):
        raise ValueError(f"{len(answers)} answers for {len(gold)} records")
    tallies: dict[str, Counter] = {}
    for i, (texts, made) in enumerate(zip(gold, answers)):
        expected = gold_calls(texts)
        for bucket in (str(len(expected)), "all"):
            tally = tallies.setdefault(bucket, Counter())
            tally.update(_record_tally(expected, made, routes[i] if routes is not None else None))
    metrics = [*SCORES, *(["routing_f1"] if routes is not None else [])]
    buckets = sorted(tallies, key=lambda b: (b == "all", b.zfill(4)))
    scores = {m: {b: _f1(tallies[b], m) for b in buckets} for m in metrics}
    return scores | {count: {b: tallies[b][count] for b in buckets} for count in ("exact_steps", "steps")}


def total_key(score: dict) -> str:
    """Where a score dict keeps its total: "all" (by position: all steps) or "avg" (pooled F1, ``metrics.call_scores``:
    the mean over the numbers of calls)."""
    return "all" if "all" in score else "avg"


def _record_tally(expected: list[tuple], made: Sequence[str | None], routes) -> Counter:
    tally = Counter(steps=len(expected))
    tally["made"] = sum(answer is not None for answer in made)
    for k, gold in enumerate(expected):
        answer = made[k] if k < len(made) and made[k] is not None else None
        name, arguments = read_call(answer) if answer is not None else (None, None)
        tally["tool_f1"] += name == gold[0]
        tally["arg_f1"] += answer is not None and arguments == gold[1]
        tally["call_f1"] += (name, arguments) == gold
        if routes is not None:
            tally["routing_f1"] += k < len(routes) and routes[k] == gold[0]
    tally["exact_steps"] = tally["call_f1"]
    tally["routes"] = sum(route is not None for route in routes) if routes is not None else 0
    return tally


def _f1(tally: Counter, metric: str) -> float:
    """Micro F1 over steps: ``2·right / (answers + steps)`` (routing: the memory tokens chosen as its answers)."""
    made = tally["routes"] if metric == "routing_f1" else tally["made"]
    return 100 * 2 * tally[metric] / (made + tally["steps"]) if made + tally["steps"] else 0.0


def outcome(gold_text: str, answer: str | None, earlier: Sequence[str] = ()) -> str:
    """What a per-step answer got wrong against its step's gold call (one of ``OUTCOMES``); ``earlier``: the gold
    calls before it in the record (in context): an answer equal to one of them is a ``repeat``, whatever else."""
    if answer is None:
        return "no call"
    gold, call = read_call(gold_text), read_call(answer)
    if call[0] is None:
        return "not a JSON call"
    if call == gold:
        return "exact"
    if any(call == read_call(text) for text in earlier):
        return "repeat"
    if call[0] != gold[0]:
        return "wrong tool"
    return "wrong key set" if dict(call[1]).keys() != dict(gold[1]).keys() else "wrong values"


def source(value, query: str, results: Sequence[str | None]) -> str:
    """Where a gold argument's value could be read before its step (one of ``SOURCES``): its text in the query,
    in the last tool result, in an older one, or nowhere (rewritten: a date from "December 15th", a sum)."""
    text = str(value).lower()
    if text in query.lower():
        return "query"
    if results and results[-1] is not None and text in results[-1].lower():
        return "last result"
    return "older result" if any(r is not None and text in r.lower() for r in results[:-1]) else "none"


def value_error(given, gold_value, gold_arguments: dict, query: str, results: Sequence[str | None]) -> str:
    """What a wrong argument value is instead of ``gold_value`` (one of ``VALUE_ERRORS``), first match in this order:
    an empty string; the gold value of another key of the same call (swapped); another date; a string that holds
    the gold's text or is held in it (a name cut short or run on, a stray space); another number (a count or an id:
    its digits are found in most contexts, so the context is not asked); text the query or an earlier result holds
    (the wrong item copied); else elsewhere (garbled, invented or recalled from training)."""
    text, gold_text = str(given).strip().lower(), str(gold_value).strip().lower()
    if given == "":
        return VALUE_ERRORS[0]
    if any(given == value for key, value in gold_arguments.items() if value != gold_value):
        return VALUE_ERRORS[1]
    if ISO_DATE.fullmatch(str(given)) and ISO_DATE.fullmatch(str(gold_value)):
        return VALUE_ERRORS[2]
    if isinstance(given, str) and isinstance(gold_value, str) and (text in gold_text or gold_text in text):
        return VALUE_ERRORS[3]
    if isinstance(given, int | float) and not isinstance(given, bool):
        return VALUE_ERRORS[4]
    return VALUE_ERRORS[5] if source(given, query, results) != "none" else VALUE_ERRORS[6]


def gold_value_sources(examples: Sequence[Example]) -> dict[str, int]:
    """The argument values of ``examples``' calls counted by where each could be read before its step (``source``):
    how much of a training or adaptation set is copying from the query, from results, or neither."""
    counts = Counter(
        source(value, example.query, [earlier.result for earlier in example.steps[:k]])
        for example in examples
        for k, step in enumerate(example.steps)
        for _, value in read_call(step.response)[1] or ()  # a step that is no call has no arguments
    )
    return {where: counts[where] for where in SOURCES}


def place(tools: Sequence[str], k: int, chosen: str) -> str:
    """Where the tool ``chosen`` at step ``k`` stands among the record's gold ``tools`` (one of ``PLACES``): the tool of
    a later step (a stage skipped), of an earlier one (a stage stayed at), or of none."""
    if chosen in tools[k + 1 :]:
        return PLACES[0]
    return PLACES[1] if chosen in tools[:k] else PLACES[2]


def outcomes(records: Sequence[dict]) -> dict:
    """The per-step answers of ``records`` (``{"query", "gold", "results", "step"}``: a tool-loop sample with the gold
    steps' results) counted by ``outcome``; ``wrong values`` also by the sources of the wrong values (a step counts
    under each source it got wrong); and ``values``: every gold value of a step whose tool was right, by source,
    right or wrong (the copying the steps need); ``wrong values, by kind``: each wrong value of a right key by what it
    is instead (``value_error``); ``wrong tools, by place``: where each wrong tool stands (``place``);
    ``wrong key sets, by key``: how often each key was left out of or added to a wrong key set, most often first."""
    steps, wrong_by_source, values, places, keys, errors = (Counter() for _ in range(6))
    for record in records:
        tools = [read_call(text)[0] for text in record["gold"]]
        for k, (gold_text, answer) in enumerate(zip(record["gold"], record["step"])):
            kind = outcome(gold_text, answer, record["gold"][:k])
            steps[kind] += 1
            gold, call = read_call(gold_text), read_call(answer) if answer is not None else (None, None)
            if kind == "wrong tool":
                places[place(tools, k, call[0])] += 1
            if call[0] != gold[0]:
                continue
            given, wrong_sources = dict(call[1]), set()
            if kind == "wrong key set":
                wanted = dict(gold[1]).keys()
                keys.update(("left out", key) for key in wanted - given.keys())
                keys.update(("added", key) for key in given.keys() - wanted)
            for key, value in gold[1]:
                where = source(value, record["query"], record["results"][:k])
                right = key in given and given[key] == value
                values[where, "right" if right else "wrong"] += 1
                if kind == "wrong values" and key in given and not right:
                    wrong_sources.add(where)
                    errors[value_error(given[key], value, dict(gold[1]), record["query"], record["results"][:k])] += 1
            wrong_by_source.update(wrong_sources)
    return {
        "steps": {kind: steps[kind] for kind in OUTCOMES},
        "wrong tools, by place": {where: places[where] for where in PLACES},
        "wrong values, by source": {where: wrong_by_source[where] for where in SOURCES},
        "values of the right tool": {w: {"right": values[w, "right"], "wrong": values[w, "wrong"]} for w in SOURCES},
        "wrong values, by kind": {kind: errors[kind] for kind in VALUE_ERRORS},
        "wrong key sets, by key": {
            change: {key: n for (c, key), n in keys.most_common() if c == change} for change in ("left out", "added")
        },
    }
