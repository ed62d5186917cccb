"""Schema-bound tool arguments: after a tool row's memory token, its arguments decode under the tool's JSON schema.

The grammar backend is xgrammar (vLLM's default structured-decoding backend; ``benchmarks/grammar_backends.py``
measured it against llguidance on this project's data).  Each tool's schema compiles once per tokenizer into a
grammar over the vocabulary; each decoded row that is writing a tool's arguments has its own matcher.

The arguments are compact JSON (``arguments_json``: no spaces), keys in the schema's order (training lays them
out so: ``data.procedures.schema_order``), no key the schema lacks; required keys, types and enums as the schema
says; a string or integer the schema leaves unbounded gets a bound (``bounded``), so that a call always closes.
(xgrammar's ``any_order`` would accept the data's own key order, but then lets calls without a required key through.)  An argument may also be a reference to an earlier call's result, ``"$var1.path$"`` (the NESTFUL
convention of chains written without results), whatever its type, where the row allows it: ``tokmem.generate``'s
rows (a chain in one go, results unknown) do, a conversation's (``tokmem.chat``: results in context, so arguments
are values) do not.

``ArgumentGrammar`` is pure over token ids and logits, so any decoding loop (``decode``, the server's engine)
can use it: ``advance(tokens)`` after each step, ``constrain(logits)`` before each pick.  While a row's JSON is
open its memory tokens and EOS are masked; once it closes, only EOS or a memory token (the next call) may follow.
"""

from __future__ import annotations

import functools
import json
import re

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
# Bounds on a value whose schema sets none, so that a call always closes (a runaway string — an SQL statement, a
# 150-digit id — would otherwise run to max_new_tokens and leave the JSON open).  Training stores a string bound
# learned from the training values in the bank's schema (``learned_bounds``); 128 characters, the default, hold the
# longest free-text value of ComplexFuncBench's queries (83); a tool that needs longer ones says so with ``maxLength``.
STRING_BOUND = 128
INTEGER_BOUND = 10**15  # |an integer argument|: at most 16 digits
# the least bound learned from training values (``learned_bounds``): a city seen as "Oslo" may be longer
LEARNED_FLOOR = 32
_BITS = torch.arange(32, dtype=torch.int32)


def decoding_schema(parameters: dict, references: bool = True) -> dict:
    """The schema arguments decode under: ``parameters`` with no extra keys, and with ``references`` each argument
    also accepting a reference to an earlier result (``REFERENCE``).  An array argument without ``items`` gets
    ``ANY_ITEM``; strings and integers are ``bounded``."""
    properties = {
        name: {"anyOf": [_with_items(spec), REFERENCE]} if references else _with_items(spec)
        for name, spec in parameters.get("properties", {}).items()
    }
    return bounded(
        {
            "type": "object",
            "properties": properties,
            "required": list(parameters.get("required", [])),
            "additionalProperties": False,
        }
    )


def bounded(schema):
    """``schema`` (a copy) with every string and integer that sets no bound of its own bounded, so that a call always
    closes: strings to ``STRING_BOUND`` characters (or the schema's ``maxLength``), integers to ±``INTEGER_BOUND``
    (``minimum``/``maximum``); a string with a ``pattern``, ``format``, ``enum`` or ``const`` is left as it is.

    A string's bound is a ``pattern`` of plain characters: xgrammar 0.2.8's own ``maxLength`` rule lets raw control
    characters (invalid JSON) through, and neither writes escapes, so a bounded string holds no quote, backslash or
    newline: the price of a call that always closes.  Non-integer numbers stay unbounded: xgrammar 0.2.8 writes a
    number with a range with at most 6 decimals, which would cut the coordinates a call copies from a result."""
    if isinstance(schema, list):
        return [bounded(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _bounded_under(key, value) for key, value in schema.items()}
    if out.get("type") == "string" and not _SHAPED & out.keys():
        low = out.pop("minLength", 0)
        out["pattern"] = _PLAIN % (low, out.pop("maxLength", max(STRING_BOUND, low)))
    if out.get("type") == "integer" and not _INTEGER_BOUNDS & out.keys():
        out.update(minimum=-INTEGER_BOUND, maximum=INTEGER_BOUND)
    return out


def learned_bounds(schema: dict | None, tool: str, examples) -> dict | None:
    """``schema`` (a copy) with a ``maxLength`` on each string argument that sets no bound, learned from the values
    the training ``examples``' calls of ``tool`` gave it: twice the longest, at least ``LEARNED_FLOOR`` characters.
    An argument no call gave a value to (only references, or nothing) keeps the default bound (``bounded``)."""
    if schema is None or not isinstance(schema.get("properties"), dict):
        return schema
    calls = [
        json.loads(s.call_arguments) for e in examples for s in e.steps if s.procedure == tool and s.call_arguments
    ]
    properties = dict(schema["properties"])
    for name, spec in properties.items():
        given = [len(c[name]) for c in calls if isinstance(c.get(name), str) and not _REFERENCE.fullmatch(c[name])]
        if (
            given
            and isinstance(spec, dict)
            and spec.get("type") == "string"
            and not (_SHAPED | {"maxLength"}) & spec.keys()
        ):
            properties[name] = {**spec, "maxLength": max(LEARNED_FLOOR, 2 * max(given), spec.get("minLength", 0))}
    return {**schema, "properties": properties}


def _bounded_under(key: str, value):
    if key in _UNTOUCHED:
        return value
    if key in _SCHEMA_MAPS and isinstance(value, dict):
        return {name: bounded(spec) for name, spec in value.items()}
    return bounded(value)


_PLAIN = r'^[^"\\\x00-\x1f]{%d,%d}$'  # %d to %d characters, none of which JSON escapes
# JSON values, not schemas (and a bound under ``not`` would invert)
_UNTOUCHED = {"enum", "const", "default", "examples", "not"}
_SCHEMA_MAPS = {"properties", "$defs", "definitions"}  # name → schema
# a string of one of these shapes is bounded by it (or not ours to bound)
_SHAPED = {"pattern", "format", "enum", "const"}
_REFERENCE = re.compile(REFERENCE["pattern"])
_INTEGER_BOUNDS = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "enum", "const"}


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
        key = json.dumps([parameters, references], sort_keys=True)
        if key not in self.compiled:
            self.compiled[key] = self.compiler.compile_json_schema(
                decoding_schema(parameters, references),
                any_whitespace=False,
                separators=(",", ":"),
                strict_mode=False,
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
    """Per decoded row, the matcher of the tool arguments it is writing (None: unconstrained).

    ``schemas[i][r]`` is, for decoded row i, its bank row r's tool schema, or None (a text row, or a tool without
    one: decoded as before); rows of one batch may use different banks (the server's engine).  ``references[i]``:
    whether row i's arguments may be references to earlier results (``decoding_schema``).  ``select`` and ``join``
    follow the rows as they leave and join a running batch.
    """

    def __init__(self, grammars: Grammars, schemas: list[list[dict | None]], eos: int, references: list[bool]):
        self.grammars, self.schemas, self.eos, self.references = grammars, list(schemas), eos, list(references)
        self.vocab = grammars.vocab_size
        self.matchers: list[xgrammar.GrammarMatcher | None] = [None] * len(self.schemas)
        self.batch = xgrammar.BatchGrammarMatcher(max_threads=1)

    def select(self, keep: list[int]) -> "ArgumentGrammar":
        """The rows ``keep``, with their matchers as they are."""
        return self._with(
            [self.schemas[i] for i in keep], [self.matchers[i] for i in keep], [self.references[i] for i in keep]
        )

    def join(self, other: "ArgumentGrammar") -> "ArgumentGrammar":
        """These rows, then ``other``'s."""
        return self._with(
            self.schemas + other.schemas, self.matchers + other.matchers, self.references + other.references
        )

    def _with(self, schemas, matchers, references) -> "ArgumentGrammar":
        grammar = ArgumentGrammar(self.grammars, schemas, self.eos, references)
        grammar.matchers, grammar.batch = matchers, self.batch
        return grammar

    def advance(self, tokens: torch.Tensor) -> None:
        """Feed each row's new token: a memory token starts its tool's grammar (or none); EOS ends the row's."""
        tokens = tokens.tolist()
        for i, token in enumerate(tokens):
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
        closed = allowed[:, self.eos]  # the JSON is complete: the next call's memory token may follow
        rows = torch.tensor(active, device=logits.device)
        logits[rows, : self.vocab] = logits[rows, : self.vocab].masked_fill(~allowed, float("-inf"))
        logits[rows, self.vocab :] = logits[rows, self.vocab :].masked_fill(~closed.unsqueeze(-1), float("-inf"))
        return logits
