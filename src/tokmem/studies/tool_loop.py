"""The tool loop measured: each method answers ComplexFuncBench's records one call at a time, with results in context.

Two evaluations, as ComplexFuncBench and NESTFUL run them:

* per step (``step_predictions``): for each call of a record, the context holds the query, the gold earlier calls and
  their recorded responses; the method predicts the next call.  A record's predicted calls (one per step) are scored
  against its gold calls.
* end to end (``loop_predictions``): the method runs the loop on its own; an offline executor (``ReplayExecutor``)
  answers a predicted call with the recorded response of the gold call it equals (each gold call once), an error
  message otherwise.  The loop ends when the method answers without a call, or after ``max_calls`` calls.

The context is the training layout (``tokmem.sequences.encode``) cut before the step to predict.  TokMem answers
through ``tokmem.chat_batch`` (memory tokens, schema-bound arguments, the records' conversations decoded together,
one KV cache per conversation reused across its steps); every other method answers ``plain_context`` (the same
layout with each call's JSON where TokMem has its memory token and arguments; ICL and RAG put their prompt,
``Method.prompts``, in the user turn; native tool calling the conversation as its chat template lays it out with the
tools, ``NativeTools.contexts``) through ``Method.continue_contexts``, and its first call is read from the text
(``Method.read_calls``).

Per step, TokMem must call a tool (``tool_choice="required"``: a call is due).  End to end its first turn must too
(every test query needs a tool, as TokMem's study answers always route), and after a result it may stop (``"auto"``,
the open-set rule at ``DecodeConfig``'s default threshold): after the last result it was trained to answer in words
(``tokmem.sequences.ANSWER``), not to call again.  That answer, which ComplexFuncBench also scores, is not predicted:
the loop ends at the first turn without a call.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace

from tokmem.chat import ChatCache, chat_batch, conversation_ids
from tokmem.data.procedures import Example, arguments_json, assemble_call
from tokmem.decode import DecodeConfig
from tokmem.eval import metrics
from tokmem.eval.steps import aligned_scores, outcomes
from tokmem.methods.method import Method
from tokmem.methods.native import NativeTools
from tokmem.methods.tokmem import TokMem
from tokmem.model import TokMemModel
from tokmem.sequences import RESULT_TOKENS, Calls, chat_prefix, turn_ids
from tokmem.studies.harness import PhaseBars, answering_cost

NO_RECORDED_RESPONSE = '{"error":"no recorded response for this call: its tool or arguments differ from the gold call"}'
History = list[tuple[str, str]]  # (call JSON text, its result) of the calls so far


def plain_context(tokenizer, prompt: str, history: History, result_tokens: int) -> list[int]:
    """The layout without memory tokens (the one fine-tuning trains on) of a conversation so far: the user turn,
    then each call's JSON, EOS and its result's tool turn, ending where the next call starts (``sequences.turn_ids``,
    the layout training and chat share)."""
    turns = [Calls([tokenizer(call, add_special_tokens=False)["input_ids"]], [result]) for call, result in history]
    return chat_prefix(tokenizer, prompt) + turn_ids(tokenizer, turns, result_tokens)[0]


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


def next_calls(
    method: Method, examples: list[Example], histories: list[History], caches: list, result_tokens: int, choice: str
) -> tuple[list[tuple[str | None, str | None]], int]:
    """Each conversation's next call (JSON text) and the tool its memory token chose (TokMem; None for a method
    without memory tokens), or ``(None, None)`` where the method answers without a call; and the tokens of the
    contexts answered (the prompt tokens)."""
    if isinstance(method, TokMem):
        config = (
            method.decode_config
            if choice == "required"
            else replace(method.decode_config, threshold=DecodeConfig.threshold)
        )
        conversations = [conversation(e, h) for e, h in zip(examples, histories)]
        replies = chat_batch(
            method.model, conversations, tool_choice=choice, config=config, caches=caches, result_tokens=result_tokens
        )
        calls = [
            (assemble_call(r.tool_calls[0].name, r.tool_calls[0].arguments), r.tool_calls[0].name)
            if r.tool_calls
            else (None, None)
            for r in replies
        ]
        return calls, sum(len(conversation_ids(method.model, c, result_tokens)) for c in conversations)
    contexts = method_contexts(method, examples, histories, result_tokens)
    texts = method.continue_contexts(contexts)
    return [(next(iter(method.read_calls(text)), None), None) for text in texts], sum(map(len, contexts))


def method_contexts(method: Method, examples: list[Example], histories: list[History], result_tokens: int):
    """The contexts a method without memory tokens answers: native tool calling's chat template with its tools
    (``NativeTools.contexts``), else ``plain_context`` with the method's prompt in the user turn."""
    if isinstance(method, NativeTools):
        return method.contexts([conversation(e, h) for e, h in zip(examples, histories)], result_tokens)
    tokenizer = method.model.backbone.tokenizer
    prompts = method.prompts([e.query for e in examples])
    return [plain_context(tokenizer, p, h, result_tokens) for p, h in zip(prompts, histories)]


def step_predictions(method: Method, examples: list[Example], result_tokens: int, bar) -> tuple[list, list, int]:
    """Per step: each record's predicted calls, one for each of its gold calls (None where the method made no call),
    the gold ones before it in context; the tool each step's memory token chose (None for a method without memory
    tokens), aligned the same way; and the prompt tokens of all the steps."""
    predicted: list[list[str | None]] = [[] for _ in examples]
    routes: list[list[str | None]] = [[] for _ in examples]
    caches = [ChatCache() for _ in examples]
    prompt_tokens = 0
    for k in range(max(len(e.steps) for e in examples)):
        due = [i for i, e in enumerate(examples) if k < len(e.steps)]
        histories = [[(s.response, s.result) for s in examples[i].steps[:k]] for i in due]
        calls, tokens = next_calls(
            method, [examples[i] for i in due], histories, [caches[i] for i in due], result_tokens, "required"
        )
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


def loop_predictions(
    method: Method, examples: list[Example], max_calls: int, result_tokens: int, bar
) -> list[list[str]]:
    """End to end: each record's calls as the method makes them, each answered by its ``ReplayExecutor``.  A call
    that is not a JSON call (``json_call``) is kept, to be scored, but ends its record's loop: nothing can run it."""
    predicted: list[list[str]] = [[] for _ in examples]
    histories: list[History] = [[] for _ in examples]
    executors = [ReplayExecutor(e) for e in examples]
    caches = [ChatCache() for _ in examples]
    running = list(range(len(examples)))
    for turn in range(max_calls):
        answered, _ = next_calls(
            method,
            [examples[i] for i in running],
            [histories[i] for i in running],
            [caches[i] for i in running],
            result_tokens,
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


def loop_scores(method: Method, examples: list[Example], max_calls: int, result_tokens: int, bar) -> dict:
    """The method's answers per step and end to end, scored by position (``steps.aligned_scores``: each answer
    against its own step's gold call; per step TokMem's memory-token choices also as routing F1), the pooled F1
    besides (``step_pooled``, ``end_to_end_pooled``: ``metrics.call_scores``, a record's answers as one multiset, as earlier
    results were scored), what the per-step answers got wrong (``steps.outcomes``), the cost of a call answered per
    step (each step answers one gold call: ``answering_cost``) and every record's answers, to read what fails (a few
    dozen records: small; per step aligned with the gold calls, null where no call was made)."""
    bar.phase(f"{method.name}: answering {len(examples)} records step by step", len(examples))
    start = time.perf_counter()
    steps, routes, prompt_tokens = step_predictions(method, examples, result_tokens, bar)
    cost = answering_cost(prompt_tokens, time.perf_counter() - start, sum(len(e.steps) for e in examples))
    bar.phase(f"{method.name}: running {len(examples)} records end to end", len(examples))
    loops = loop_predictions(method, examples, max_calls, result_tokens, bar)
    memory = isinstance(method, TokMem)
    samples = [
        {
            "query": e.query,
            "gold": [s.response for s in e.steps],
            "results": [s.result for s in e.steps],
            "step": p,
            **({"routes": r} if memory else {}),
            "end_to_end": q,
        }
        for e, p, r, q in zip(examples, steps, routes, loops)
    ]
    return {
        **scored_samples(samples, memory),
        **cost,
        "samples": samples,
    }


def scored_samples(samples: list[dict], memory: bool) -> dict:
    """A tool loop's scores from its samples (what ``loop_scores`` keeps): per step and end to end by position, the
    pooled F1 besides, and the per-step outcomes; ``memory``: the samples carry the memory tokens' ``routes``."""
    gold = [s["gold"] for s in samples]
    routes = [s["routes"] for s in samples] if memory else None
    return {
        "step": aligned_scores(gold, [s["step"] for s in samples], routes),
        "end_to_end": aligned_scores(gold, [s["end_to_end"] for s in samples]),
        "step_pooled": metrics.call_text_scores(
            gold, [made(s["step"]) for s in samples], routes and [made(r) for r in routes]
        ),
        "end_to_end_pooled": metrics.call_text_scores(gold, [s["end_to_end"] for s in samples]),
        "outcomes": outcomes(samples),
    }


def model_loop(model: TokMemModel, examples: list[Example], config: DecodeConfig) -> dict:
    """``loop_scores`` of a trained bank (``evaluate``'s ``loop``, what ``tokmem eval`` runs): per step and end to
    end, each record's calls answered with its recorded results, for one more call than the longest record."""
    method = TokMem.trained(model, config)
    return loop_scores(method, examples, max(len(e.steps) for e in examples) + 1, RESULT_TOKENS, PhaseBars(False))
