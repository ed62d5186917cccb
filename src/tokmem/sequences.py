"""The training sequence and its label mask.

    chat(query)  m_i  r_i  m_j  r_j  …  EOS

The query is formatted with the backbone's chat template (generation prompt included).  Labels
cover the memory tokens, the response tokens and EOS; the query is never a target.  After the memory
token of a tool (a procedure in ``tools``) comes only the call's arguments JSON, as in the reference
code: the memory token *is* the tool choice, so the model never spells the tool's name.

Truncation policy (when the sequence exceeds ``max_length``): the targets are kept whole and the
query is cut from the left (its oldest tokens go first, at least one token stays); if the targets
alone are too long, they are cut at the end as well (the EOS is lost).  Both are counted.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

import torch

from tokmem.data.procedures import Example
from tokmem.errors import DataError, TokMemError

IGNORE = -100


def chat_prefix(tokenizer, query: str | list[dict]) -> list[int]:
    """Token ids of the query as a user turn, ending where the assistant's answer starts.

    ``query`` may also be a whole conversation (chat messages with ``role`` and ``content``) that ends
    with the user's turn; one user message is the same as its text.
    """
    return tokenizer("".join(_chat_texts(tokenizer, query)), add_special_tokens=False)["input_ids"]


def chat_turns(tokenizer, query: str) -> tuple[list[int], list[int]]:
    """Token ids of the query's user turn and of the assistant header after it (chat_prefix split in two).

    Layouts that put something between the two (the GSM8K reference layout's memory token) use it;
    without a chat template the header is empty.
    """
    turn, header = _chat_texts(tokenizer, query)
    return tokenizer(turn, add_special_tokens=False)["input_ids"], tokenizer(header, add_special_tokens=False)["input_ids"]


def _chat_texts(tokenizer, query: str | list[dict]) -> tuple[str, str]:
    """The chat-formatted conversation and the assistant header (the generation prompt) as text."""
    messages = [{"role": "user", "content": query}] if isinstance(query, str) else query
    if not tokenizer.chat_template:
        if len(messages) != 1:
            raise DataError("this backbone has no chat template, so a query must be a single user message")
        return f"{messages[0]['content']}\n", ""
    turn = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    whole = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if not whole.startswith(turn):
        raise TokMemError("the backbone's chat template does not end the user turn before the assistant header")
    return turn, whole[len(turn) :]


@dataclass
class Encoded:
    input_ids: list[int]
    labels: list[int]


@dataclass
class TruncationCount:
    queries: int = 0
    responses: int = 0
    examples: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.queries or self.responses)

    def describe(self, total: int, max_length: int) -> str:
        """One line for a training summary: how many of ``total`` sequences were cut, and where."""
        shown = ", ".join(self.examples[:3]) + (", …" if len(self.examples) > 3 else "")
        return (f"{self.queries} of {total} training sequences were longer than {max_length} tokens ({shown}): "
                f"{self.queries - self.responses} lost the start of their query (responses kept whole), "
                f"{self.responses} also lost the end of their responses (cut mid-answer, no EOS)")


def encode(example: Example, tokenizer, memory_id, max_length: int, truncated: TruncationCount | None = None,
           tools: Collection[str] = ()) -> Encoded:
    """Lay out one example; ``memory_id(name)`` maps a procedure to its token id; ``tools``: the procedures
    whose segments are their calls' arguments only.

    ``memory_id=None`` lays out the plain query → response sequence (no memory tokens) that the
    fine-tuning baselines train on: the segments one per line, as ``example.response`` shows them.
    """
    prefix = chat_prefix(tokenizer, example.query)
    if memory_id is None:
        target = tokenizer(example.response, add_special_tokens=False)["input_ids"]
    else:
        target = []
        for step in example.steps:
            target.append(memory_id(step.procedure))
            target += tokenizer(_segment(example, step, tools), add_special_tokens=False)["input_ids"]
    target.append(tokenizer.eos_token_id)

    cut_query = len(prefix) + len(target) > max_length
    cut_response = len(target) > max_length - 1
    if cut_response:
        target = target[: max_length - 1]
    if cut_query:
        prefix = prefix[len(prefix) - (max_length - len(target)) :]
    if truncated is not None and cut_query:
        truncated.queries += 1
        truncated.responses += int(cut_response)
        truncated.examples.append(example.id or example.query[:40])
    return Encoded(prefix + target, [IGNORE] * len(prefix) + target)


def _segment(example: Example, step, tools: Collection[str]) -> str:
    if step.procedure not in tools:
        return step.response
    if step.call_arguments is None:
        raise DataError(f"example {example.id or repr(example.query[:40])}: '{step.procedure}' is a tool in the bank, "
                        f'but its step is not a call of it ({{"name": "{step.procedure}", "arguments": {{…}}}})')
    return step.call_arguments


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids that skip left padding: 0 at each row's first real token."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def collate(encoded: list[Encoded], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a batch into input_ids, attention_mask and labels."""
    width = max(len(e.input_ids) for e in encoded)
    ids = torch.full((len(encoded), width), pad_id, dtype=torch.long)
    labels = torch.full((len(encoded), width), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(encoded), width), dtype=torch.long)
    for i, e in enumerate(encoded):
        n = len(e.input_ids)
        ids[i, :n] = torch.tensor(e.input_ids)
        labels[i, :n] = torch.tensor(e.labels)
        mask[i, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}
