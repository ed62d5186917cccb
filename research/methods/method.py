"""The interface every method of a study implements, and the plain-backbone decoding they share.

A method learns procedures in rounds (``learn``: one task, or a mixture of tasks, a round) and
answers queries.  The studies drive TokMem and every baseline through this interface alone.

Baselines that answer with the backbone itself decode with TokMem's own decoder on an empty bank,
which is the plain backbone (no memory token can be chosen): every method then shares the same
chat prompt, the same batched, left-padded, cached greedy decoding and the same stopping rule; the
prompted ones (RAG, ICL) also stop at their answer's end, the first blank line (``prompted_answers``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from tokmem.data.procedures import Example
from tokmem.decoding.decode import DecodeConfig, HeldPrefix, Segment, complete, generate
from tokmem.eval import metrics
from tokmem.model import TokMemModel
from tokmem.training.sequences import chat_prefix


@dataclass
class Answer:
    text: str
    choice: str | None = None  # the procedure the method picked (TokMem's memory token, RAG's top demonstration)
    segments: list[Segment] | None = (
        None  # TokMem: each memory token's procedure and text; None: the answer is one text
    )


def predicted_calls(answer: Answer) -> list[str]:
    """The call texts of an answer: TokMem's segments, one call each, or else the calls found in its text."""
    if answer.segments is not None:
        return [segment.text for segment in answer.segments]
    return metrics.split_calls(answer.text)


def memory_routes(answer: Answer) -> list[str] | None:
    """The tools an answer's memory tokens chose (TokMem), or None for a method without memory tokens."""
    if answer.segments is None:
        return None
    return [segment.procedure for segment in answer.segments if segment.procedure is not None]


class Method:
    name = ""
    label = ""  # as tables print it
    choice_metric: str | None = None  # what the accuracy of ``Answer.choice`` is called, if the method makes one
    learns = True  # False: the answers never change, so a study may reuse a task's earlier scores
    epochs = 0  # passes over a round's examples (0: learning trains nothing), for a study's progress bar
    updates = 0  # optimiser steps taken so far, over every round: the budget a study compares methods at
    learn_report: dict | None = None  # its last round's training beyond the updates (TokMem: refit, sequences cut)
    on_step: Callable[[float], None] | None = None  # set by a study to follow a round: gets the fraction done
    decode_config = DecodeConfig()  # how it answers (its new tokens, its batch): each method sets its study's
    call_grammar = None  # xgrammar.CompiledGrammar: its calls schema-bound (``research.methods.call_grammar``)

    def counting_steps(self) -> Callable[[int, int], None]:
        """The ``on_step(done, total)`` of one training round: ``updates`` becomes the updates before the round plus
        the round's ``done`` — which counts, in a round resumed from a checkpoint, the steps taken before the
        interruption too — and a long round shows progress."""
        before = self.updates

        def report(done: int, total: int) -> None:
            self.updates = before + done
            if self.on_step is not None:
                self.on_step(done / total)

        return report

    def trainable_params(self) -> int:
        return 0

    def learn(self, examples: list[Example]) -> None:
        """One round on the examples of one or more procedures (``Example.procedures`` names them)."""

    def answer(self, queries: list[str]) -> list[Answer]:
        raise NotImplementedError

    def prompts(self, queries: list[str]) -> list[str]:
        """The user turn each query is asked in: the query itself, or (prompted methods) with tools and
        demonstrations around it."""
        return queries

    def prompt_ids(self, queries: list[str]) -> list[list[int]]:
        """The tokens the backbone reads before it answers each query (its prompt tokens): the chat-formatted
        user turn (``prompts``)."""
        return [chat_prefix(self.model.backbone.tokenizer, prompt) for prompt in self.prompts(queries)]

    def read_calls(self, text: str) -> list[str]:
        """The call texts of an answer the method wrote without memory tokens (``metrics.split_calls``)."""
        return metrics.split_calls(text)

    def continue_contexts(self, contexts: list[list[int]], call_due: bool = False) -> list[str]:
        """The text the method's plain backbone writes after each context (token ids, up to EOS): a method without
        memory tokens answering a conversation laid out as ``research.studies.tool_loop.plain_context`` does.

        With a ``call_grammar`` (``research.methods.call_grammar``: schema-bound calls) a call is written under it:
        every answer where ``call_due`` (a call is forced, as TokMem's study answers are), else the answers whose
        free text starts a call (``{``), decoded again under it; the others stay words (the model stopped)."""
        texts = (
            [""] * len(contexts)
            if call_due and self.call_grammar
            else complete(self.model, contexts, self.decode_config)
        )
        if self.call_grammar is None:
            return texts
        calls = [i for i, text in enumerate(texts) if call_due or text.startswith("{")]
        bound = complete(self.model, [contexts[i] for i in calls], self.decode_config, self.call_grammar)
        for i, text in zip(calls, bound):
            texts[i] = text
        return texts

    def save(self, directory: Path) -> bool:
        """Write the learned state under ``directory``; False when the method keeps none (rebuilt by learning again)."""
        return False

    def load(self, directory: Path) -> bool:
        """Restore what ``save`` wrote; False when there is nothing to restore."""
        return False


def plain_answers(
    model: TokMemModel,
    prompts: list[str | list[dict] | list[int]],
    config: DecodeConfig,
    held: HeldPrefix | None = None,
) -> list[str]:
    """Greedy answers of ``model``'s backbone (its bank must be empty) to prompts (queries, chat conversations or
    token ids laid out by the caller), decoded as ``config`` says; ``held``: see ``HeldPrefix``."""
    return [g.text for g in generate(model, prompts, config, held=held)]


def first_block(text: str) -> str:
    """The text up to its first blank line, without the spaces around it (so that an answer cut where decoding
    stopped equals the same answer cut from a longer decoding)."""
    return text.strip().split("\n\n", 1)[0].rstrip()


def prompted_answers(model: TokMemModel, prompts: list[str], config: DecodeConfig) -> list[str]:
    """The stop rule of every prompted baseline (RAG, ICL) in every study: their demonstrations end each answer
    with a blank line, so an answer ends at its first blank line (decoding stops there; the text is cut there)."""
    texts = plain_answers(model, prompts, replace(config, stop_at_blank_line=True))
    return [first_block(text) for text in texts]
