"""Schema-bound calls for methods without memory tokens: the decoding aids TokMem's rows have, given to LoRA.

TokMem decodes a tool's arguments under the tool's schema fitted to its training calls (``schemas.learned_schema``:
the optional keys no call gave dropped, strings bounded, keys in the calls' order), narrowed to one of the key sets
its training calls wrote (key-set rows), and where a call is due it must call.  A fine-tuned model writes the whole
call, ``{"name":…,"arguments":{…}}`` (compact JSON, as it was trained), so the same aids are one grammar over the
whole call: one of the tools by name, then its arguments under the same learned schema, narrowed to one of the same
training key sets (the grammar admits any of them: the model's own tokens choose, where TokMem's key-set row
chooses).  ``complete`` decodes under it (``tokmem.decoding.decode.complete``'s ``grammar``).
"""

from __future__ import annotations

import json
from collections import Counter

import xgrammar

from tokmem.bank.key_sets import narrowed
from tokmem.data.procedures import Example
from tokmem.decoding.grammar import grammars_for
from tokmem.schemas import Budget, decoding_schema, learned_schema

WHOLE_CALLS = Budget(max_chars=4_000_000, max_depth=64)  # every tool's schema in one grammar


def key_sets(tool: str, examples: list[Example]) -> list[tuple[str, ...]]:
    """The key sets the training calls of ``tool`` wrote, most written first."""
    calls = (s.call_arguments for e in examples for s in e.steps if s.procedure == tool and s.call_arguments)
    return [keys for keys, _ in Counter(tuple(sorted(json.loads(call))) for call in calls).most_common()]


def tool_arguments(schema: dict, tool: str, examples: list[Example]) -> list[dict]:
    """The argument schemas a call of ``tool`` may take: its schema fitted to the training calls, narrowed to each
    key set they wrote (the whole fitted schema where they wrote one, or none)."""
    learned = learned_schema(schema, tool, examples)
    sets = key_sets(tool, examples)
    if len(sets) < 2:
        return [learned]
    return [n for n in (narrowed(learned, keys) for keys in sets) if n is not None] or [learned]


def call_schema(schemas: dict[str, dict], examples: list[Example]) -> dict:
    """The JSON schema of one call of any tool of ``schemas`` (name → arguments' schema), fitted to the training
    ``examples``: ``{"name": <the tool>, "arguments": <one of tool_arguments>}``, no other key."""
    alternatives, definitions = [], {}
    for tool, schema in schemas.items():
        for arguments in tool_arguments(schema, tool, examples):
            bound = decoding_schema(arguments, references=False, where=f"tools.{tool}", budget=WHOLE_CALLS)
            for name, spec in bound.pop("$defs", {}).items():
                if definitions.setdefault(name, spec) != spec:
                    raise ValueError(f"tools.{tool}: two tools define '$defs.{name}' differently")
            call = {"name": {"const": tool}, "arguments": bound}
            alternatives.append(
                {"type": "object", "properties": call, "required": ["name", "arguments"], "additionalProperties": False}
            )
    return {"anyOf": alternatives, **({"$defs": definitions} if definitions else {})}


def compile_calls(backbone, schemas: dict[str, dict], examples: list[Example]) -> xgrammar.CompiledGrammar:
    """``call_schema`` compiled over ``backbone``'s vocabulary."""
    grammars = grammars_for(backbone.tokenizer, backbone.vocab_size, WHOLE_CALLS)
    return grammars.compile(call_schema(schemas, examples), "tools")
