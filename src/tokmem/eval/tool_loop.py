"""The tool loop: a record's calls answered one at a time, each call's recorded result in context, and scored.

Two evaluations, as ComplexFuncBench and NESTFUL run them:

* per step (``step_predictions``): for each call of a record, the context holds the query, the gold earlier calls and
  their recorded responses; the answerer predicts the next call.
* end to end (``loop_predictions``): the answerer runs the loop on its own; an offline executor (``ReplayExecutor``)
  answers a predicted call with the recorded response of the gold call it equals (each gold call once), an error
  message otherwise.  The loop ends when the answerer answers without a call, or after ``max_calls`` calls.

Both are scored by position (``steps.aligned_scores``: each answer against its own step's gold call), the pooled F1
besides (``metrics.call_scores``), with the per-step outcomes (``steps.outcomes``).  An ``Answerer`` makes each
conversation's next call: a trained bank answers through ``tokmem.chat_batch`` (``chat_answerer``: memory tokens,
schema-bound arguments, the records' conversations decoded together, one KV cache per conversation reused across its
steps); the studies wrap every other method the same way (``research.studies.tool_loop``).

Per step a call is due (``tool_choice="required"``).  End to end the first turn must call too (every record needs a
tool), and after a result the answerer may stop (``"auto"``): after the last result a bank was trained to answer in
words (``tokmem.training.sequences.ANSWER``), not to call again.  That answer is not predicted: the loop ends at the
first turn without a call.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace

from tokmem.decoding.chat import ChatCache, chat_batch
from tokmem.decoding.conversation import context_after, conversation_ids
from tokmem.data.procedures import Example, arguments_json, assemble_call
from tokmem.decoding.decode import DecodeConfig
from tokmem.eval import metrics
from tokmem.eval.steps import aligned_scores, outcomes
from tokmem.model import TokMemModel
from tokmem.training.sequences import RESULT_TOKENS

NO_RECORDED_RESPONSE = '{"error":"no recorded response for this call: its tool or arguments differ from the gold call"}'
History = list[tuple[str, str]]  # (call JSON text, its result) of the calls so far
Call = tuple[str | None, str | None]  # a call's JSON text and the tool its memory token chose (None: none)
# (records, their histories, their caches, tool_choice) -> each conversation's next call, and the prompt tokens read
Answerer = Callable[[list[Example], list[History], list[ChatCache], str], tuple[list[Call], int]]


def chat_answerer(
    model: TokMemModel,
    config: DecodeConfig,
    result_tokens: int = RESULT_TOKENS,
    avoid_repeats: bool | None = None,
    tools: list | None = None,
) -> Answerer:
    """A trained bank's answers (``tokmem.chat_batch``): the call it makes and the tool its memory token chose, or
    ``(None, None)`` where it answers without a call.  Where a call is due (``required``) ``config`` decodes (its
    threshold may be 0: a call is forced anyway); where it may stop (``auto``), at the open-set rule's default
    threshold.  ``avoid_repeats``: ``chat_batch``'s (None: a call answered since the user's message is not repeated
    under ``auto`` only; True: at every step too); ``tools``: ``chat_batch``'s (OpenAI tool objects whose
    ``parameters`` bind their arguments; None: the bank's tools and schemas)."""

    def answer(examples, histories, caches, choice):
        decode = config if choice == "required" else replace(config, threshold=DecodeConfig.threshold)
        conversations = [conversation(e, h) for e, h in zip(examples, histories)]
        replies = chat_batch(
            model,
            conversations,
            tools=tools,
            tool_choice=choice,
            config=decode,
            caches=caches,
            result_tokens=result_tokens,
            avoid_repeats=avoid_repeats,
        )
        calls = [
            (assemble_call(r.tool_calls[0].name, r.tool_calls[0].arguments), r.tool_calls[0].name)
            if r.tool_calls
            else (None, None)
            for r in replies
        ]
        read = sum(len(conversation_ids(model, c, result_tokens)) for c in conversations)
        return calls, read + sum(context_tokens(model, tool) for _, tool in calls if tool is not None)

    return answer


def context_tokens(model: TokMemModel, tool: str) -> int:
    """The prompt tokens a call's context adds after routing (its tail, its shown schema; else 0)."""
    return len(context_after(model, model.memory_id(tool))) - 1


def conversation(example: Example, history: History) -> list[dict]:
    """The OpenAI messages of a conversation so far (what ``tokmem.chat`` lays out as TokMem trained)."""
    messages = [{"role": "user", "content": example.query}]
    for k, (call, result) in enumerate(history):
        name, arguments = json_call(call)
        function = {"name": name, "arguments": arguments}
        messages.append(
            {"role": "assistant", "content": None, "tool_calls": [{"id": f"call_{k}", "function": function}]}
        )
        messages.append({"role": "tool", "tool_call_id": f"call_{k}", "content": result})
    return messages


def json_call(call: str) -> tuple[str, str] | None:
    """A call's name and arguments (compact JSON) when its text is a JSON call ``{"name", "arguments": {…}}``."""
    try:
        parsed = json.loads(call)
    except ValueError:
        return None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("name"), str):
        return None
    arguments = parsed.get("arguments")
    return (parsed["name"], arguments_json(arguments)) if isinstance(arguments, dict) else None


def step_predictions(answer: Answerer, examples: list[Example], bar) -> tuple[list, list, int]:
    """Per step: each record's predicted calls, one for each of its gold calls (None where no call was made), the
    gold ones before it in context; the tool each step's memory token chose (None without memory tokens), aligned
    the same way; and the prompt tokens of all the steps."""
    predicted: list[list[str | None]] = [[] for _ in examples]
    routes: list[list[str | None]] = [[] for _ in examples]
    caches = [ChatCache() for _ in examples]
    prompt_tokens = 0
    for k in range(max(len(e.steps) for e in examples)):
        due = [i for i, e in enumerate(examples) if k < len(e.steps)]
        histories = [[(s.response, s.result) for s in examples[i].steps[:k]] for i in due]
        calls, tokens = answer([examples[i] for i in due], histories, [caches[i] for i in due], "required")
        prompt_tokens += tokens
        for i, (call, route) in zip(due, calls):
            predicted[i].append(call)
            routes[i].append(route)
        bar.update(sum(len(examples[i].steps) == k + 1 for i in due))  # the records answered in full
    return predicted, routes, prompt_tokens


def made(calls: list[str | None]) -> list[str]:
    """The calls a method made (a step it answered without a call is left out: it is scored as a missing call)."""
    return [call for call in calls if call is not None]


class ReplayExecutor:
    """The offline executor of one record: a call equal to a gold call not yet answered (``metrics.read_call``:
    same tool, same canonical arguments) gets that call's recorded response; any other call an error message."""

    def __init__(self, example: Example):
        self.pending = [(metrics.read_call(s.response), s.result) for s in example.steps]

    def __call__(self, call: str) -> str:
        parsed = metrics.read_call(call)
        for k, (gold, result) in enumerate(self.pending):
            if parsed == gold:
                del self.pending[k]
                return result
        return NO_RECORDED_RESPONSE


def loop_predictions(answer: Answerer, examples: list[Example], max_calls: int, bar) -> list[list[str]]:
    """End to end: each record's calls as the answerer makes them, each answered by its ``ReplayExecutor``.  A call
    that is not a JSON call (``json_call``) is kept, to be scored, but ends its record's loop: nothing can run it."""
    predicted: list[list[str]] = [[] for _ in examples]
    histories: list[History] = [[] for _ in examples]
    executors = [ReplayExecutor(e) for e in examples]
    caches = [ChatCache() for _ in examples]
    running = list(range(len(examples)))
    for turn in range(max_calls):
        answered, _ = answer(
            [examples[i] for i in running],
            [histories[i] for i in running],
            [caches[i] for i in running],
            "auto" if turn else "required",
        )
        calls = [call for call, _ in answered]
        for i, call in zip(running, calls):
            predicted[i] += [call] if call is not None else []
            if call is not None and json_call(call):
                histories[i].append((call, executors[i](call)))
        running = [i for i, call in zip(running, calls) if call is not None and json_call(call)]
        if not running:
            break
    bar.update(len(examples))
    return predicted


def loop_scores(
    answer: Answerer, examples: list[Example], max_calls: int, bar, name: str, memory: bool, end_to_end: bool = True
) -> dict:
    """The answers per step and end to end, scored (``scored_samples``), the cost of a call answered per step (each
    step answers one gold call: ``metrics.answering_cost``) and every record's answers, to read what fails (per step
    aligned with the gold calls, null where no call was made).  ``name`` labels the progress ``bar``'s phases;
    ``memory``: the answerer has memory tokens, whose choices are kept and scored as routing; ``end_to_end`` False:
    per step only (half the time: a decoding A/B that reads the per-step outcomes)."""
    bar.phase(f"{name}: answering {len(examples)} records step by step", len(examples))
    start = time.perf_counter()
    steps, routes, prompt_tokens = step_predictions(answer, examples, bar)
    cost = metrics.answering_cost(prompt_tokens, time.perf_counter() - start, sum(len(e.steps) for e in examples))
    loops = [None] * len(examples)
    if end_to_end:
        bar.phase(f"{name}: running {len(examples)} records end to end", len(examples))
        loops = loop_predictions(answer, examples, max_calls, bar)
    samples = [
        {
            "query": e.query,
            "gold": [s.response for s in e.steps],
            "results": [s.result for s in e.steps],
            "step": p,
            **({"routes": r} if memory else {}),
            **({"end_to_end": q} if end_to_end else {}),
        }
        for e, p, r, q in zip(examples, steps, routes, loops)
    ]
    return {**scored_samples(samples, memory), **cost, "samples": samples}


def scored_samples(samples: list[dict], memory: bool) -> dict:
    """A tool loop's scores from its samples (what ``loop_scores`` keeps): per step and end to end by position (where
    the samples have end-to-end answers), the pooled F1 besides, and the per-step outcomes; ``memory``: the samples
    carry the memory tokens' ``routes``."""
    gold = [s["gold"] for s in samples]
    routes = [s["routes"] for s in samples] if memory else None
    scores = {
        "step": aligned_scores(gold, [s["step"] for s in samples], routes),
        "step_pooled": metrics.call_text_scores(
            gold, [made(s["step"]) for s in samples], routes and [made(r) for r in routes]
        ),
        "outcomes": outcomes(samples),
    }
    if all("end_to_end" in s for s in samples):
        loops = [s["end_to_end"] for s in samples]
        scores |= {
            "end_to_end": aligned_scores(gold, loops),
            "end_to_end_pooled": metrics.call_text_scores(gold, loops),
        }
    return scores


class _Quiet:
    """A progress bar that shows nothing."""

    def phase(self, description: str, total: int) -> None:
        pass

    def update(self, n: int = 1) -> None:
        pass


def model_loop(model: TokMemModel, examples: list[Example], config: DecodeConfig) -> dict:
    """``loop_scores`` of a trained bank (what ``tokmem eval`` runs on records whose steps carry results): per step
    and end to end, each record's calls answered with its recorded results, for one more call than the longest
    record."""
    longest = max(len(e.steps) for e in examples)
    return loop_scores(chat_answerer(model, config), examples, longest + 1, _Quiet(), "bank", memory=True)
