"""The tool loop measured for every method of a study: each answers ComplexFuncBench's records one call at a time,
with results in context (``tokmem.eval.tool_loop``: per step and end to end, scored by position).

The context is the training layout (``tokmem.sequences.encode``) cut before the step to predict.  TokMem answers
through ``tokmem.chat_batch`` (``eval.tool_loop.chat_answerer``); every other method answers ``plain_context`` (the
same layout with each call's JSON where TokMem has its memory token and arguments; ICL and RAG put their prompt,
``Method.prompts``, in the user turn; native tool calling the conversation as its chat template lays it out with the
tools, ``NativeTools.contexts``) through ``Method.continue_contexts``, and its first call is read from the text
(``Method.read_calls``).  TokMem's study answers must route (its method decodes at threshold 0); end to end after a
result it may stop, at the open-set rule's default threshold.
"""

from __future__ import annotations

from tokmem.data.procedures import Example
from tokmem.eval import tool_loop
from tokmem.eval.tool_loop import History, conversation
from research.methods.method import Method
from research.methods.native import NativeTools
from research.methods.tokmem import TokMem
from tokmem.training.sequences import Calls, chat_prefix, turn_ids


def plain_context(tokenizer, prompt: str, history: History, result_tokens: int) -> list[int]:
    """The layout without memory tokens (the one fine-tuning trains on) of a conversation so far: the user turn,
    then each call's JSON, EOS and its result's tool turn, ending where the next call starts (``sequences.turn_ids``,
    the layout training and chat share)."""
    turns = [Calls([tokenizer(call, add_special_tokens=False)["input_ids"]], [result]) for call, result in history]
    return chat_prefix(tokenizer, prompt) + turn_ids(tokenizer, turns, result_tokens)[0]


def answerer(method: Method, result_tokens: int) -> tool_loop.Answerer:
    """The method's next calls (``eval.tool_loop.Answerer``): TokMem's through ``chat_answerer``; any other method's
    first call read from its continuation of ``method_contexts`` (no memory tokens: no tool chosen)."""
    if isinstance(method, TokMem):
        return tool_loop.chat_answerer(method.model, method.decode_config, result_tokens)

    def answer(examples, histories, caches, choice):
        contexts = method_contexts(method, examples, histories, result_tokens)
        texts = method.continue_contexts(contexts, call_due=choice == "required")
        return [(next(iter(method.read_calls(text)), None), None) for text in texts], sum(map(len, contexts))

    return answer


def method_contexts(method: Method, examples: list[Example], histories: list[History], result_tokens: int):
    """The contexts a method without memory tokens answers: native tool calling's chat template with its tools
    (``NativeTools.contexts``), else ``plain_context`` with the method's prompt in the user turn."""
    if isinstance(method, NativeTools):
        return method.contexts([conversation(e, h) for e, h in zip(examples, histories)], result_tokens)
    tokenizer = method.model.backbone.tokenizer
    prompts = method.prompts([e.query for e in examples])
    return [plain_context(tokenizer, p, h, result_tokens) for p, h in zip(prompts, histories)]


def step_predictions(method: Method, examples: list[Example], result_tokens: int, bar) -> tuple[list, list, int]:
    """``eval.tool_loop.step_predictions`` of the method."""
    return tool_loop.step_predictions(answerer(method, result_tokens), examples, bar)


def loop_scores(
    method: Method, examples: list[Example], max_calls: int, result_tokens: int, bar, end_to_end: bool = True
) -> dict:
    """``eval.tool_loop.loop_scores`` of the method (TokMem's memory-token choices scored as routing; another
    method's, having no memory token, not at all)."""
    answer = answerer(method, result_tokens)
    memory = isinstance(method, TokMem)
    return tool_loop.loop_scores(answer, examples, max_calls, bar, method.name, memory, end_to_end)
