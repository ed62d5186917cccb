"""The training sequence and its label mask.

    chat(query)  m_i  r_i  m_j  r_j  …  EOS
    chat(query)  m_i  args_i  EOS <tool turn: result_i> <assistant header>  m_j  args_j  EOS <…>  answer  EOS

The query is formatted with the backbone's chat template (generation prompt included).  Labels
cover the memory tokens, the response tokens and EOS; the query is never a target.  After the memory
token of a tool (a procedure in ``tools``) comes only the call's arguments JSON, as in the reference
code: the memory token *is* the tool choice, so the model never spells the tool's name.  Where the tool's
schema is known (``tools`` maps names to schemas) the arguments are written in the schema's key order, the order
schema-bound decoding writes them in.

A step with a ``result`` ends the assistant's turn after its call (EOS, trained: the call is complete), then the
result follows as the backbone's chat template writes a ``role: "tool"`` message (Qwen's: a user turn with the result
in ``<tool_response>`` tags), then the next assistant header; none of that is trained on.  After the last result the
assistant answers in words: the example's ``answer`` and EOS where it has one (trained as a response is), else one
``ANSWER`` label: the position learns to answer in words (the probability of all vocabulary tokens together), not
which words, so that decoding leaves it to the backbone's own reply with the bank masked (the open-set path) instead
of learning to stop in silence.  A template that does not render a tool role gets the result as a user message
``Tool result:\n…``; a backbone without a template gets ``Tool result: …`` on a line.  A result longer than
``result_tokens`` tokens is cut there and says so (``… [result cut: N of M tokens shown]``).

An example with no steps is an off-topic query (``tokmem.data.off_topic``): its one label, at the routing position,
is ``ANSWER``: the rows learn to leave it to the backbone (the open-set rule), not what the backbone says.

A bank of several memory tokens a procedure (``MemoryBank.memory_tokens``) lays out each tool call as its memory token,
then the tool's tail (its further memory tokens, context: not a target), then the arguments.  A bank that *shows
schemas* (``MemoryBank.shows_schemas``, the ``tokmem+schema`` method) puts the tool's schema there as context
(``shown_schema_ids``): the memory token picks the tool, and the tool's parameters are in view while its arguments
are written.  Either is a ``CallContext``.

``turn_ids`` is the one layout of what follows the query (turns of calls and results, answers, a user's next
messages): ``encode`` lays out an example's steps through it, and decoding (``tokmem.chat``) a conversation's turns,
so a bank meets at run time exactly the tokens it was trained on.

Truncation policy (when the sequence exceeds ``max_length``): the query is cut from the left (its oldest tokens go
first) so that the targets stay whole, but it keeps at least half of ``max_length`` (or all of itself, if shorter):
targets learnt without their query teach nothing but noise (a first tool call with no request before it).  Targets
that do not fit beside that are cut at the end (the EOS is lost).  Both are counted.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import torch
from jinja2.exceptions import TemplateError

from tokmem.data.procedures import Example, arguments_json, schema_order
from tokmem.errors import DataError, TokMemError
from tokmem.schemas import KEY_ORDERS, UNTRAINED

IGNORE = -100
ANSWER = -2  # label: "a vocabulary token, not a memory token" (the answer in words after the last tool result)
RESULT_TOKENS = 256  # default budget of one tool result in a sequence


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
    return tokenizer(turn, add_special_tokens=False)["input_ids"], tokenizer(header, add_special_tokens=False)[
        "input_ids"
    ]


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


@dataclass(frozen=True)
class ResultTurn:
    """The text around the turns that follow the assistant's (tool results, or a user's next messages), as the chat
    template writes them: ``after_call`` follows the EOS that ends the assistant's turn, the messages are ``opening``,
    the first, ``between`` and each next one, ``closing``; ``header`` starts the next assistant turn.  (ChatML gives
    each message its own turn, ``between`` = closing + opening; Qwen's template puts consecutive tool results in one
    user turn, each in ``<tool_response>`` tags.)"""

    after_call: str
    opening: str
    between: str
    closing: str
    header: str


_CALL, _RESULTS = "\x00call\x00", ("\x00result1\x00", "\x00result2\x00")
PLAIN_RESULT = ResultTurn("\n", "Tool result: ", "\nTool result: ", "\n", "")


@functools.lru_cache(maxsize=8)
def result_turn(tokenizer) -> ResultTurn:
    """The backbone's ``ResultTurn``: its template's tool role, else a user turn, else (no template) a plain line."""
    if not tokenizer.chat_template:
        return PLAIN_RESULT
    return _template_turn(tokenizer, "tool", "") or _template_turn(tokenizer, "user", "Tool result:\n") or PLAIN_RESULT


def _template_turn(tokenizer, role: str, lead: str) -> ResultTurn | None:
    """The pieces read off the template by rendering a placeholder call and one, then two messages of ``role`` after
    it; None if it does not render them so."""
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _CALL}]
    results = [{"role": role, "content": lead + placeholder} for placeholder in _RESULTS]
    render = functools.partial(tokenizer.apply_chat_template, tokenize=False)
    try:
        base, one, two = render(messages), render([*messages, results[0]]), render([*messages, *results])
        whole = render([*messages, *results], add_generation_prompt=True)
    except TemplateError:
        return None
    call_end = _CALL + tokenizer.eos_token
    if call_end not in base or not two.startswith(base) or not whole.startswith(two) or two.count(_RESULTS[0]) != 1:
        return None
    opening, rest = two[len(base) :].split(_RESULTS[0])
    if rest.count(_RESULTS[1]) != 1:
        return None
    between, closing = rest.split(_RESULTS[1])
    if one != base + opening + _RESULTS[0] + closing:
        return None
    return ResultTurn(base[base.index(call_end) + len(call_end) :], opening, between, closing, whole[len(two) :])


@functools.lru_cache(maxsize=8)
def user_turn(tokenizer) -> ResultTurn:
    """The pieces of the user turns that follow an assistant's answer (its EOS), as the template writes them."""
    plain = ResultTurn("\n", "", "\n", "\n", "")
    return (tokenizer.chat_template and _template_turn(tokenizer, "user", "")) or plain


def result_ids(tokenizer, results: list[str], budget: int = RESULT_TOKENS) -> list[int]:
    """Token ids after a call turn's EOS: the tool turns of ``results`` (each cut to ``budget`` tokens) as the template
    writes consecutive tool messages, then the next assistant header."""
    return _turn_ids(tokenizer, result_turn(tokenizer), results, budget)


def user_turn_ids(tokenizer, contents: list[str]) -> list[int]:
    """Token ids after an assistant answer's EOS: the user turns of ``contents``, then the next assistant header (a
    conversation that goes on after tool results, ``tokmem.chat``)."""
    return _turn_ids(tokenizer, user_turn(tokenizer), contents, None)


def _turn_ids(tokenizer, pieces: ResultTurn, contents: list[str], budget: int | None) -> list[int]:
    words = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    ids = words(pieces.after_call) + words(pieces.opening)
    for k, text in enumerate(contents):
        ids += (words(pieces.between) if k else []) + result_content_ids(tokenizer, text, budget)
    return ids + words(pieces.closing) + words(pieces.header)


def result_content_ids(tokenizer, text: str, budget: int | None = RESULT_TOKENS) -> list[int]:
    """A result's tokens, cut to ``budget`` (None: whole) with a note saying so: the one rule every layout of a
    tool result follows."""
    words = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    content = words(text)
    if budget is not None and len(content) > budget:
        content = content[:budget] + words(f" … [result cut: {budget} of {len(content)} tokens shown]")
    return content


@dataclass(frozen=True)
class Calls:
    """An assistant turn of calls: each call's tokens (``tool_call_ids``, or another layout's segment); where the
    tools answered (``results``, one per call), EOS ends the turn and the results follow as tool turns, then the next
    assistant header (``result_ids``); without results the turn runs on (a chain written without results)."""

    calls: list[list[int] | CallContext]
    results: list[str] | None = None


@dataclass(frozen=True)
class CallContext:
    """A tool call with context between its memory token and its arguments: the memory token (written), the context
    (the tool's tail, its shown schema: read, not written), the arguments (written)."""

    memory: int
    context: list[int]
    arguments: list[int]

    @property
    def ids(self) -> list[int]:
        return [self.memory, *self.context, *self.arguments]

    @property
    def labels(self) -> list[int]:
        return [self.memory, *[IGNORE] * len(self.context), *self.arguments]


@dataclass(frozen=True)
class Answer:
    """The assistant's answer in words, ended by EOS."""

    text: str


@dataclass(frozen=True)
class UserTurns:
    """The user's next messages after an answer (``user_turn_ids``), up to the next assistant header."""

    contents: list[str]


def turn_ids(tokenizer, turns: list, result_tokens: int = RESULT_TOKENS) -> tuple[list[int], list[int]]:
    """The tokens after the query (``chat_prefix``) of ``turns`` (``Calls``, ``Answer``, ``UserTurns``) and their
    labels: what the assistant writes (calls, the EOS that ends a turn, an answer) is labelled, the results and the
    user's turns around it are context (``IGNORE``).  The one layout of a conversation: training (``encode``) and
    decoding (``tokmem.chat``) both lay out through it."""
    ids, labels = [], []
    for turn in turns:
        written, written_labels, context = _written_and_context(tokenizer, turn, result_tokens)
        ids += written + context
        labels += written_labels + [IGNORE] * len(context)
    return ids, labels


def _written_and_context(tokenizer, turn, result_tokens: int) -> tuple[list[int], list[int], list[int]]:
    """(what the assistant's turn holds, its labels, the context after it) of one turn: the assistant's tokens are
    its own but for a call's context (``CallContext``)."""
    eos = tokenizer.eos_token_id
    if isinstance(turn, UserTurns):
        return [], [], user_turn_ids(tokenizer, turn.contents)
    if isinstance(turn, Answer):
        written = tokenizer(turn.text, add_special_tokens=False)["input_ids"] + [eos]
        return written, written, []
    written = [token for call in turn.calls for token in (call.ids if isinstance(call, CallContext) else call)]
    labels = [label for call in turn.calls for label in (call.labels if isinstance(call, CallContext) else call)]
    if turn.results is None:
        return written, labels, []
    return written + [eos], labels + [eos], result_ids(tokenizer, turn.results, result_tokens)


def tool_call_ids(
    tokenizer, memory_id: int, arguments: dict, schema: dict | None, show_schema: bool = False, tail: list[int] = ()
) -> list[int] | CallContext:
    """A tool call as a tool's segment: its memory token, then its arguments as compact JSON, in the schema's key
    order where the schema is known (the order schema-bound decoding writes them in); ``tail``: the tool's further
    memory tokens, and ``show_schema``: its schema where it is known, between the two (``CallContext``)."""
    text = arguments_json(arguments if schema is None else schema_order(arguments, schema))
    written = tokenizer(text, add_special_tokens=False)["input_ids"]
    context = [*tail, *(shown_schema_ids(tokenizer, schema) if show_schema and schema is not None else [])]
    return CallContext(memory_id, context, written) if context else [memory_id, *written]


def shown_schema_ids(tokenizer, schema: dict) -> list[int]:
    """The tokens of a tool's schema as a bank that shows schemas lays it out after the memory token: the compact
    JSON of its parameters on a line of its own (without the key orders it was trained in, the grammar's, or the
    arguments it never learned)."""
    shown = {key: value for key, value in schema.items() if key not in (KEY_ORDERS, UNTRAINED)}
    return tokenizer(f"\n{arguments_json(shown)}\n", add_special_tokens=False)["input_ids"]


@dataclass
class Encoded:
    input_ids: list[int]
    labels: list[int]


@dataclass
class TruncationCount:
    """Training sequences longer than ``max_length``: how many, how many lost the start of their query and how many
    the end of their targets (a sequence may lose both), and their ids."""

    sequences: int = 0
    queries: int = 0
    responses: int = 0
    examples: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.sequences)

    def describe(self, total: int, max_length: int) -> str:
        """One line for a training summary: how many of ``total`` sequences were cut, and where."""
        shown = ", ".join(self.examples[:3]) + (", …" if len(self.examples) > 3 else "")
        return (
            f"{self.sequences} of {total} training sequences were longer than {max_length} tokens ({shown}): "
            f"{self.queries} lost the start of their query, "
            f"{self.responses} the end of their responses (cut mid-answer, no EOS)"
        )


def query_tokens_kept(query: int, targets: int, max_length: int) -> int:
    """How many of a query's ``query`` tokens (its last) a sequence of ``targets`` target tokens keeps within
    ``max_length``: all that fit beside the whole targets, but at least half the window (the truncation policy)."""
    return min(query, max(max_length - targets, max_length // 2, 1))


def encode(
    example: Example,
    tokenizer,
    memory_id,
    max_length: int,
    truncated: TruncationCount | None = None,
    tools: Collection[str] = (),
    result_tokens: int = RESULT_TOKENS,
    show_schemas: bool = False,
    tail_ids=None,
) -> Encoded:
    """Lay out one example; ``memory_id(name)`` maps a procedure to its token id; ``tools``: the procedures
    whose segments are their calls' arguments only (a mapping name → schema or None orders the arguments by the
    schema); ``result_tokens``: the budget of each step's result; ``show_schemas``: a bank that shows schemas;
    ``tail_ids(memory id)``: a tool's tail (a bank of several memory tokens a procedure).

    ``memory_id=None`` lays out the plain query → response sequence (no memory tokens) that the
    fine-tuning baselines train on: the segments one per line, as ``example.response`` shows them; where the steps
    carry results, each step's call text (``step_ids``) takes its memory token's place in the layout above, so that
    TokMem and fine-tuning train on the same sequences but for the memory tokens.
    """
    prefix = chat_prefix(tokenizer, example.query)
    if not example.steps and memory_id is None:
        raise DataError(
            f"example {example.id or repr(example.query[:40])}: an off-topic example (no steps) teaches memory rows "
            "to leave a query to the backbone; a layout without memory tokens has nothing to learn from it"
        )
    if memory_id is None and all(step.result is None for step in example.steps):
        target = tokenizer(example.response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        labels = list(target)
    else:
        steps = [
            Calls(
                [step_ids(example, s, tokenizer, memory_id, tools, show_schemas, tail_ids)],
                None if s.result is None else [s.result],
            )
            for s in example.steps
        ]
        target, labels = turn_ids(tokenizer, [*steps, Answer(example.answer or "")], result_tokens)
        if example.answer is None and memory_id is not None and (example.ends_with_result or not example.steps):
            labels[-1] = ANSWER  # after a last result, or an off-topic query: answer in words, not which words

    kept_query = query_tokens_kept(len(prefix), len(target), max_length)
    cut = (kept_query < len(prefix), len(target) > max_length - kept_query)
    target, labels = target[: max_length - kept_query], labels[: max_length - kept_query]
    prefix = prefix[len(prefix) - kept_query :]
    if truncated is not None and any(cut):
        truncated.sequences += 1
        truncated.queries += int(cut[0])
        truncated.responses += int(cut[1])
        truncated.examples.append(example.id or example.query[:40])
    return Encoded(prefix + target, [IGNORE] * len(prefix) + labels)


def step_ids(
    example: Example,
    step,
    tokenizer,
    memory_id=None,
    tools: Collection[str] = (),
    show_schemas: bool = False,
    tail_ids=None,
) -> list[int] | CallContext:
    """One step's tokens: its memory token and its segment (a tool's call: ``tool_call_ids``), or, without memory
    tokens (``memory_id=None``: the fine-tuning and prompted layouts), the step's whole response (the call's JSON)."""
    words = tokenizer(step.response, add_special_tokens=False)["input_ids"]
    if memory_id is None:
        return words
    if step.procedure not in tools:
        return [memory_id(step.procedure), *words]
    if step.call_arguments is None:
        raise DataError(
            f"example {example.id or repr(example.query[:40])}: '{step.procedure}' is a tool in the bank, "
            f'but its step is not a call of it ({{"name": "{step.procedure}", "arguments": {{…}}}})'
        )
    schema = tools.get(step.procedure) if isinstance(tools, Mapping) else None
    memory = memory_id(step.procedure)
    tail = tail_ids(memory) if tail_ids else []
    return tool_call_ids(tokenizer, memory, json.loads(step.call_arguments), schema, show_schemas, tail)


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """A collated batch on ``device``; on a GPU from pinned host memory, so the copy does not block the host."""
    if device.type != "cuda":
        return {k: v.to(device) for k, v in batch.items()}
    return {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}


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
