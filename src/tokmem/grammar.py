"""Schema-bound tool arguments: after a tool row's memory token, its arguments decode under the tool's JSON schema.

The grammar backend is xgrammar (vLLM's default structured-decoding backend; ``benchmarks/grammar_backends.py``
measured it against llguidance on this project's data).  Each tool's schema compiles once per tokenizer into a
grammar over the vocabulary; each decoded row that is writing a tool's arguments has its own matcher.

The arguments are compact JSON (``arguments_json``: no spaces), keys in the schema's order (training lays them
out so: ``data.procedures.schema_order``), no key the schema lacks; required keys, types and enums as the schema
says.  (xgrammar's ``any_order`` would accept the data's own key order, but then lets calls without a required key
through.)  An argument may also be a reference to an earlier call's result, ``"$var1.path$"`` (the NESTFUL
convention of chains written without results), whatever its type, where the row allows it: ``tokmem.generate``'s
rows (a chain in one go, results unknown) do, a conversation's (``tokmem.chat``: results in context, so arguments
are values) do not.

``ArgumentGrammar`` is pure over token ids and logits, so any decoding loop (``decode``, the server's engine)
can use it: ``advance(tokens)`` after each step, ``constrain(logits)`` before each pick.  While a row's JSON is
open its memory tokens and EOS are masked; once it closes, only EOS or a memory token (the next call) may follow.

A row may also answer under a whole-response schema (OpenAI's ``response_format``): its text is then that JSON
from its first token.  Until the row has a token, only its vocabulary is constrained (its memory tokens stay as
routing leaves them: the turn may still start with a tool call, which then follows its tool's schema instead).
"""

from __future__ import annotations

import functools
import json

import torch
import xgrammar

# "$var2.coordinates.latitude$", "$var1.data[0].id$": bounded, so that a reference always closes
REFERENCE = {"type": "string", "pattern": r"^\$var[0-9]{1,3}(\.[A-Za-z_][A-Za-z0-9_]{0,31}|\[[0-9]{1,4}\]){0,4}\$$"}
# What an array without ``items`` may hold.  xgrammar 0.2.8's own "any value" rule, with compact separators, accepts
# one element only and objects of one key only; spelled out like this it accepts the data's lists of objects.
ANY_ITEM = {
    "anyOf": [
        {"type": "object", "additionalProperties": True},
        {"type": "string"},
        {"type": "number"},
        {"type": "boolean"},
    ]
}
_BITS = torch.arange(32, dtype=torch.int32)


def decoding_schema(parameters: dict, references: bool = True) -> dict:
    """The schema arguments decode under: ``parameters`` with no extra keys, and with ``references`` each argument
    also accepting a reference to an earlier result (``REFERENCE``).  An array argument without ``items`` gets
    ``ANY_ITEM``."""
    properties = {
        name: {"anyOf": [_with_items(spec), REFERENCE]} if references else _with_items(spec)
        for name, spec in parameters.get("properties", {}).items()
    }
    return {
        "type": "object",
        "properties": properties,
        "required": list(parameters.get("required", [])),
        "additionalProperties": False,
    }


def _with_items(spec: dict) -> dict:
    return {**spec, "items": ANY_ITEM} if spec.get("type") == "array" and "items" not in spec else spec


class Grammars:
    """Compiled tool grammars for one tokenizer (``vocab_size`` rows of logits), each schema compiled once."""

    def __init__(self, tokenizer, vocab_size: int):
        self.vocab_size = vocab_size
        info = xgrammar.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=[tokenizer.eos_token_id]
        )
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1)
        self.compiled: dict[str, xgrammar.CompiledGrammar] = {}

    def matcher(self, parameters: dict, references: bool = True) -> xgrammar.GrammarMatcher:
        """A fresh matcher for arguments under the tool schema ``parameters`` (``decoding_schema``)."""
        return self._matcher(decoding_schema(parameters, references), strict=False)

    def response_matcher(self, schema: dict) -> xgrammar.GrammarMatcher:
        """A fresh matcher for a whole answer under ``schema`` (compact JSON, no property the schema lacks)."""
        return self._matcher(schema, strict=True)

    def _matcher(self, schema: dict, strict: bool) -> xgrammar.GrammarMatcher:
        key = json.dumps([schema, strict], sort_keys=True)
        if key not in self.compiled:
            self.compiled[key] = self.compiler.compile_json_schema(
                schema, any_whitespace=False, separators=(",", ":"), strict_mode=strict
            )
        return xgrammar.GrammarMatcher(self.compiled[key])


@functools.lru_cache(maxsize=4)
def grammars_for(tokenizer, vocab_size: int) -> Grammars:
    """The one ``Grammars`` per tokenizer (compiled grammars are reused across calls)."""
    return Grammars(tokenizer, vocab_size)


def allowed_tokens(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """A bool (rows, vocab_size) tensor from the backends' packed int32 bitmask (32 tokens a word)."""
    return ((bitmask.unsqueeze(-1) >> _BITS) & 1).bool().flatten(1)[:, :vocab_size]


class ArgumentGrammar:
    """Per decoded row, the matcher of the JSON it is writing (None: unconstrained).

    ``schemas[i][r]`` is, for decoded row i, its bank row r's tool schema, or None (a text row, or a tool without
    one: decoded as before); rows of one batch may use different banks (the server's engine).  ``references[i]``:
    whether row i's arguments may be references to earlier results (``decoding_schema``).  ``responses[i]``: row i's
    whole-response schema, or None (default: none).  ``select`` and ``join`` follow the rows as they leave and join a
    running batch.
    """

    def __init__(
        self,
        grammars: Grammars,
        schemas: list[list[dict | None]],
        eos: int,
        references: list[bool],
        responses: list[dict | None] | None = None,
    ):
        self.grammars, self.schemas, self.eos, self.references = grammars, list(schemas), eos, list(references)
        self.vocab = grammars.vocab_size
        responses = responses or [None] * len(self.schemas)
        self.matchers = [None if r is None else grammars.response_matcher(r) for r in responses]
        self.started = [False] * len(self.schemas)  # whether the row has its first token (see the module's docstring)
        self.batch = xgrammar.BatchGrammarMatcher(max_threads=1)

    def select(self, keep: list[int]) -> "ArgumentGrammar":
        """The rows ``keep``, with their matchers as they are."""
        return self._with(*([values[i] for i in keep] for values in self._rows()))

    def join(self, other: "ArgumentGrammar") -> "ArgumentGrammar":
        """These rows, then ``other``'s."""
        return self._with(*(mine + theirs for mine, theirs in zip(self._rows(), other._rows())))

    def _rows(self) -> tuple[list, list, list, list]:
        return self.schemas, self.matchers, self.references, self.started

    def _with(self, schemas, matchers, references, started) -> "ArgumentGrammar":
        grammar = ArgumentGrammar(self.grammars, schemas, self.eos, references)
        grammar.matchers, grammar.started, grammar.batch = matchers, started, self.batch
        return grammar

    def advance(self, tokens: torch.Tensor) -> None:
        """Feed each row's new token: a memory token starts its tool's grammar (or none); EOS ends the row's."""
        tokens = tokens.tolist()
        for i, token in enumerate(tokens):
            self.started[i] = True
            if token >= self.vocab:
                schema = self.schemas[i][token - self.vocab]
                self.matchers[i] = None if schema is None else self.grammars.matcher(schema, self.references[i])
            elif token == self.eos:
                self.matchers[i] = None
        fed = [i for i, token in enumerate(tokens) if token < self.vocab and self.matchers[i] is not None]
        accepted = xgrammar.BatchGrammarMatcher.batch_accept_token(
            [self.matchers[i] for i in fed], [tokens[i] for i in fed]
        )
        for i, ok in zip(fed, accepted):
            if not ok:  # only where the mask was not applied (a forced or replayed token): the row goes free
                self.matchers[i] = None

    def constrain(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` over vocab ∪ bank with each constrained row's disallowed tokens at -inf (in place)."""
        active = [i for i, m in enumerate(self.matchers) if m is not None]
        if not active:
            return logits
        bitmask = xgrammar.allocate_token_bitmask(len(active), self.vocab)
        self.batch.batch_fill_next_token_bitmask([self.matchers[i] for i in active], bitmask)
        allowed = allowed_tokens(bitmask, self.vocab).to(logits.device)
        # the JSON is complete (the next call's memory token may follow), or the row has no token yet (routing decides)
        memory = allowed[:, self.eos] | ~torch.tensor([self.started[i] for i in active], device=logits.device)
        rows = torch.tensor(active, device=logits.device)
        logits[rows, : self.vocab] = logits[rows, : self.vocab].masked_fill(~allowed, float("-inf"))
        logits[rows, self.vocab :] = logits[rows, self.vocab :].masked_fill(~memory.unsqueeze(-1), float("-inf"))
        return logits
