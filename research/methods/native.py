"""Native tool calling: the baseline a user with an instruct model picks instead of TokMem.

The frozen backbone gets the tools' schemas through its own chat template (``apply_chat_template(messages,
tools=[...])``), earlier calls as the template's assistant ``tool_calls`` and their results as its ``role: "tool"``
turns, and writes its calls in the template's convention; Qwen2.5's (the one read here)::

    <tool_call>
    {"name": "Search_Hotels", "arguments": {"query": "Paris"}}
    </tool_call>

several blocks for several calls (an answer without a block is read as the other prompted baselines' are: some
backbones write the call bare).  ``native`` shows every tool; ``native-retrieved`` only the ``k`` the study's tool
retriever (RAG's, ``ToolRetriever``) ranks first for the query.  Answers decode as every prompted baseline's do
(``plain_answers``: batched, KV-cached, greedy), the prompt prefix they share (the system turn with the tools)
encoded once for all the calls (``HeldPrefix``), and end at the backbone's EOS (the end of the assistant's turn).

A backbone whose template ignores ``tools=`` (ChatML without tool support: tiny-random's, SmolLM2's) has no native
tool calling to compare with: building the method is an error naming the backbone (no fallback prompt of ours,
which would be a fourth prompting baseline rather than the backbone's own convention).
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

from tokmem.backbones import Backbone
from tokmem.data.procedures import call_json
from tokmem.decoding.decode import DecodeConfig, HeldPrefix
from tokmem.errors import TokMemError
from tokmem.eval import metrics
from research.methods.method import Answer, Method, plain_answers
from research.methods.tools import ToolRetriever
from tokmem.model import create
from tokmem.training.sequences import RESULT_TOKENS, result_content_ids

TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)  # an unclosed block runs to the end
_PROBE = "tokmem_probe_tool"


class NativeTools(Method):
    name = "native"
    label = "Native tool calling"
    learns = False

    def __init__(
        self,
        backbone: Backbone,
        tools: dict[str, dict],
        k: int | None = None,
        decode: DecodeConfig | None = None,
        encoder=None,
    ):
        """``k``: show only the ``k`` retrieved tools (``native-retrieved``); None shows every tool."""
        check_tool_template(backbone)
        self.model = create(backbone)  # an empty bank: the plain backbone
        self.schemas = list(tools.values())
        self.retrieve_tools = None if k is None else ToolRetriever(tools, k, encoder)
        if k is not None:
            self.name, self.label = "native-retrieved", f"Native tool calling (top {k} retrieved)"
        self.decode_config = replace(decode or DecodeConfig(), share_prefix=True)  # the tools' turn, encoded once
        self.held = HeldPrefix()  # the tools' system turn, encoded once for all the calls (the backbone is frozen)

    def shown_tools(self, queries: list[str]) -> list[list[dict]]:
        """The schemas each query's prompt shows."""
        return self.retrieve_tools(queries) if self.retrieve_tools else [self.schemas] * len(queries)

    def contexts(self, conversations: list[list[dict]], result_tokens: int = RESULT_TOKENS) -> list[list[int]]:
        """Each OpenAI-style conversation (a user turn, then assistant ``tool_calls`` and ``role: "tool"`` results)
        as the template lays it out with its tools, up to where the assistant answers; results cut to
        ``result_tokens`` as every method's are (``result_content_ids``)."""
        tokenizer = self.model.backbone.tokenizer
        tools = self.shown_tools([messages[0]["content"] for messages in conversations])
        return [
            tokenizer(template_text(tokenizer, messages, shown, result_tokens), add_special_tokens=False)["input_ids"]
            for messages, shown in zip(conversations, tools)
        ]

    def prompt_ids(self, queries: list[str]) -> list[list[int]]:
        return self.contexts([[{"role": "user", "content": q}] for q in queries])

    def continue_contexts(self, contexts: list[list[int]], call_due: bool = False) -> list[str]:
        """Free, a call due or not: its calls are tags around JSON in its chat template's own format (no call grammar
        yet)."""
        return plain_answers(self.model, contexts, self.decode_config, held=self.held)

    def read_calls(self, text: str) -> list[str]:
        return read_tool_calls(text)

    def answer(self, queries: list[str]) -> list[Answer]:
        texts = self.continue_contexts(self.prompt_ids(queries))
        return [Answer("\n".join(read_tool_calls(text))) for text in texts]


def template_text(tokenizer, messages: list[dict], tools: list[dict], result_tokens: int) -> str:
    """The conversation rendered by the chat template with ``tools``, ending with the assistant header.  Templates
    take a call's arguments as an object (OpenAI's messages carry them as JSON text) and each tool as OpenAI's
    ``{"type": "function", "function": schema}``."""
    rendered = []
    for message in messages:
        if message.get("tool_calls"):
            calls = [call["function"] for call in message["tool_calls"]]
            function = [{"name": c["name"], "arguments": json.loads(c["arguments"])} for c in calls]
            message = message | {"tool_calls": [{"type": "function", "function": f} for f in function]}
        elif message.get("role") == "tool":
            content = tokenizer.decode(result_content_ids(tokenizer, message["content"], result_tokens))
            message = message | {"content": content}
        rendered.append(message)
    functions = [{"type": "function", "function": schema} for schema in tools]
    return tokenizer.apply_chat_template(rendered, tools=functions, tokenize=False, add_generation_prompt=True)


def read_tool_calls(text: str) -> list[str]:
    """The calls of an answer written in the template's convention (``<tool_call>{…}</tool_call>`` blocks), each as
    compact call JSON; a block that is not a JSON call (malformed, or cut by the token limit) is kept as a JSON
    string of its text, which the scorer reads as a call that names no tool and matches nothing (a miss).  An answer
    without any block is read as every prompted baseline's is (``metrics.split_calls``): a small backbone often
    writes its call bare (Qwen2.5-Coder-0.5B, answering after a tool result), and prose counts as a wrong call."""
    blocks = TOOL_CALL.findall(text)
    return [_call_text(block.strip()) for block in blocks] if blocks else metrics.split_calls(text)


def _call_text(block: str) -> str:
    try:
        parsed = json.loads(block)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("name"), str) and isinstance(parsed.get("arguments"), dict):
        return call_json(parsed["name"], parsed["arguments"])
    return json.dumps(block, ensure_ascii=False)


def check_tool_template(backbone: Backbone) -> None:
    """Refuse a backbone whose chat template does not show the tools it is given (no native tool calling)."""
    tokenizer = backbone.tokenizer
    probe = {"type": "function", "function": {"name": _PROBE, "description": "", "parameters": {"type": "object"}}}
    message = [{"role": "user", "content": "q"}]
    rendered = tokenizer.chat_template and tokenizer.apply_chat_template(message, tools=[probe], tokenize=False)
    if not rendered or _PROBE not in rendered:
        raise TokMemError(
            f"backbone '{backbone.name}' has no native tool calling: its chat template ignores tools= "
            "(methods native and native-retrieved need a template with tool support, e.g. Qwen2.5-Instruct's)"
        )
