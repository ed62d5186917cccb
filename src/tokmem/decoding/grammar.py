"""Schema-bound tool arguments: after a tool row's memory token, its arguments decode under the tool's JSON schema.

The grammar backend is xgrammar (vLLM's default structured-decoding backend; ``benchmarks/grammar_backends.py``
measured it against llguidance on this project's data).  ``Grammars.compile`` is the one way a schema becomes a
grammar over a tokenizer's vocabulary: checked first (``tokmem.schemas``: the features xgrammar enforces, references
resolved, size and depth bounded), compiled within a time budget off the caller's thread, cached by the schema's
hash (failures too).  Decoding only ever uses grammars compiled before it starts (``ArgumentGrammar``), so a schema
that cannot compile is refused where it came in (a bank upload, a catalog, a request), never mid-decoding.  Each
decoded row that is writing a tool's arguments has its own matcher.

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

A tool with key-set rows (``tokmem.bank.key_sets``) has a grammar per key set (``KeySetGrammars``): whoever picks a
token tells the grammar the state that picked it (``routed``), and a memory token so picked starts the grammar of
the key set that state chooses (the tool's whole schema where none of its key sets is admitted, or the row's
routing state is unknown).

A row may also answer under a whole-response grammar (OpenAI's ``response_format``): its text is then that JSON
from its first token.  Until the row has a token, only its vocabulary is constrained (its memory tokens stay as
routing leaves them: the turn may still start with a tool call, which then follows its tool's grammar instead).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass

import torch
import xgrammar

from tokmem.bank.key_sets import KeySets, narrowed
from tokmem.schemas import Budget, SchemaError, check_schema, decoding_schema, shared_leaves


class Grammars:
    """Grammars compiled for one tokenizer (``vocab_size`` rows of logits): ``compile`` is the one way in.

    Every schema is checked (``schemas.check_schema``) and compiled within ``budget`` in a thread of its own, so a
    costly schema delays only whoever sent it (xgrammar releases the GIL while it compiles); a compile past
    ``budget.seconds`` (where it sets one) is refused and left to finish in the background.  Results are cached by the schema's hash,
    failures too (the most recent ``CACHED``), so a schema that failed once fails at once after.
    """

    CACHED = 1024

    def __init__(self, tokenizer, vocab_size: int, budget: Budget = Budget()):
        self.vocab_size, self.budget = vocab_size, budget
        info = xgrammar.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=[tokenizer.eos_token_id]
        )
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)  # the cache is ours
        self.compiled: OrderedDict[str, tuple[Future, float | None]] = OrderedDict()  # hash -> (compile, deadline)
        self._lock = threading.Lock()

    def compile(self, schema, where: str = "schema") -> xgrammar.CompiledGrammar:
        """The grammar of JSON text (compact: no spaces) that ``schema`` accepts.  A ``SchemaError`` (under
        ``where``) says why it cannot be: a feature the backend does not enforce, a broken reference, over budget,
        or the backend's own refusal."""
        return self._result(*self._submitted(schema, where))

    def _submitted(self, schema, where: str) -> tuple[str, str]:
        """``schema`` checked and its compile started (or found in the cache): (its key, ``where``)."""
        checked = check_schema(schema, where, self.budget)
        # keyed as written, not with sorted keys: the grammar writes an object's keys in its schema's order
        key = hashlib.sha256(json.dumps(checked).encode()).hexdigest()
        with self._lock:
            if key not in self.compiled:
                seconds = self.budget.seconds
                self.compiled[key] = self._start(checked), None if seconds is None else time.monotonic() + seconds
                while len(self.compiled) > self.CACHED:
                    self.compiled.popitem(last=False)
            self.compiled.move_to_end(key)
        return key, where

    def _result(self, key: str, where: str) -> xgrammar.CompiledGrammar:
        """The compiled grammar under ``key``, waited for within its deadline."""
        with self._lock:
            future, deadline = self.compiled[key]
        try:
            return future.result(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            error = SchemaError(
                f"{where}: compiling the schema took longer than the limit of {self.budget.seconds:g} s"
            )
            failed = Future()
            failed.set_exception(error)
            with self._lock:
                self.compiled[key] = failed, 0.0
            raise error from None
        except RuntimeError as err:  # the backend's refusal, cached as the future's exception
            raise SchemaError(f"{where}: the grammar backend cannot compile it: {_first_line(err)}") from None

    def _start(self, schema) -> Future:
        """The compile of a checked ``schema``, running in a thread of its own."""
        future = Future()

        def run():
            try:
                grammar = xgrammar.Grammar.from_json_schema(
                    json.dumps(shared_leaves(schema)), any_whitespace=False, separators=(",", ":"), strict_mode=False
                )
                future.set_result(self.compiler.compile_grammar(numbers_bounded(grammar)))
            except Exception as err:  # noqa: BLE001 - handed to whoever waits
                future.set_exception(RuntimeError(str(err)))

        threading.Thread(target=run, name="tokmem-grammar", daemon=True).start()
        return future

    def arguments(self, parameters: dict, references: bool = True, where: str = "parameters"):
        """The compiled grammar of a tool's arguments (``decoding_schema``)."""
        return self.compile(decoding_schema(parameters, references, where, self.budget), where)

    def rows(
        self,
        schemas: list,
        references: bool = True,
        where: str = "schemas",
        fields: list | None = None,
        key_sets: list | None = None,
    ) -> list:
        """Per bank row, the compiled grammar of its tool's arguments, or None (no schema), or for a row with
        ``key_sets`` (per row, ``KeySets`` or None) its ``KeySetGrammars``: every compile started before the first is
        waited for, so the rows compile side by side (one thread each).  An error names the row as ``{where}[row]``,
        or as ``fields[row]`` where given."""
        fields = fields or [f"{where}[{row}]" for row in range(len(schemas))]
        key_sets = key_sets or [None] * len(schemas)
        pending = [  # per row: its schema, then (key-set rows) that schema narrowed to each key set
            [
                self._submitted(decoding_schema(one, references, field, self.budget), field) if one else None
                for one in row
            ]
            for row, field in zip(map(_with_key_sets, schemas, key_sets), fields)
        ]
        compiled = [[None if waiting is None else self._result(*waiting) for waiting in row] for row in pending]
        return [
            KeySetGrammars(choice, whole, narrowed_ones) if narrowed_ones else whole
            for choice, (whole, *narrowed_ones) in zip(key_sets, compiled)
        ]


def _with_key_sets(schema: dict | None, choice: KeySets | None) -> list:
    """``schema``, then for a tool with key-set rows the schema narrowed to each of its key sets (None where it does
    not admit one)."""
    if schema is None or choice is None:
        return [schema]
    return [schema, *(narrowed(schema, keys) for keys in choice.keys)]


# A JSON number of at most 16 digits before the point, 16 after it (a coordinate copied from a result has 13) and a
# 3-digit exponent: a number always ends.  xgrammar's own bound (a schema's minimum/maximum) keeps 6 decimals only.
_NUMBER = 'basic_number ::= ("-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? ([eE] [+\\-]? [0-9]{1,3})?)'
_NUMBER_RULE = re.compile(r"^basic_number ::= .*$", re.M)


def numbers_bounded(grammar: xgrammar.Grammar) -> xgrammar.Grammar:
    """``grammar`` (xgrammar's from a JSON schema) with its rule for a number without a range bounded (``_NUMBER``):
    unbounded, a model may write ``1000…`` until the token limit and the call never closes."""
    text, found = _NUMBER_RULE.subn(lambda _: _NUMBER, str(grammar), count=1)
    return xgrammar.Grammar.from_ebnf(text) if found else grammar


def _first_line(err: Exception) -> str:
    """The backend's message without its source location, cut short."""
    line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return re.sub(r"^\[[0-9:]+\] \S+: ", "", line)[:200]


@functools.lru_cache(maxsize=4)
def grammars_for(tokenizer, vocab_size: int, budget: Budget = Budget()) -> Grammars:
    """The one ``Grammars`` per tokenizer and budget (compiled grammars are reused across calls)."""
    return Grammars(tokenizer, vocab_size, budget)


@dataclass(frozen=True)
class KeySetGrammars:
    """A tool's argument grammars with key-set rows: ``whole`` (its schema) and per key set of ``choice`` the grammar
    of the schema narrowed to it (None: the schema does not admit it)."""

    choice: KeySets
    whole: xgrammar.CompiledGrammar
    narrowed: list

    def chosen(self, state: torch.Tensor | None) -> xgrammar.CompiledGrammar:
        """The grammar of the admitted key set ``state`` (the state that routed the tool) scores highest; ``whole``
        without a state or an admitted key set."""
        admitted = torch.tensor([grammar is not None for grammar in self.narrowed])
        if state is None or not admitted.any():
            return self.whole
        return self.narrowed[int(self.choice.scores(state).masked_fill(~admitted, float("-inf")).argmax())]


class ArgumentGrammar:
    """Per decoded row, the matcher of the JSON it is writing (None: unconstrained).

    ``grammars[i][r]`` is, for decoded row i, its bank row r's compiled argument grammar (``Grammars.rows``), or
    None (a text row, or a tool without a schema: decoded as before); rows of one batch may use different banks (the
    server's engine).  ``responses[i]``: row i's compiled whole-response grammar, or None (default: none).  Nothing
    is compiled here: whoever decodes compiles first, so a schema's failure is its sender's alone.  ``select`` and
    ``join`` follow the rows as they leave and join a running batch.
    """

    def __init__(self, grammars: list[list], vocab_size: int, eos: int, responses: list | None = None):
        self.grammars, self.vocab, self.eos = list(grammars), vocab_size, eos
        responses = responses or [None] * len(self.grammars)
        self.matchers = [None if r is None else xgrammar.GrammarMatcher(r) for r in responses]
        self.started = [False] * len(self.grammars)  # whether the row has its first token (see the module's docstring)
        self.states = [None] * len(self.grammars)  # per row, the state that picked its last token where it has key sets
        self.keyed = [i for i, row in enumerate(self.grammars) if any(isinstance(g, KeySetGrammars) for g in row)]
        self.batch = xgrammar.BatchGrammarMatcher(max_threads=1)

    def select(self, keep: list[int]) -> "ArgumentGrammar":
        """The rows ``keep``, with their matchers as they are."""
        return self._with(*([values[i] for i in keep] for values in self._rows()))

    def join(self, other: "ArgumentGrammar") -> "ArgumentGrammar":
        """These rows, then ``other``'s."""
        return self._with(*(mine + theirs for mine, theirs in zip(self._rows(), other._rows())))

    def _rows(self) -> tuple[list, list, list, list]:
        return self.grammars, self.matchers, self.started, self.states

    def _with(self, grammars, matchers, started, states) -> "ArgumentGrammar":
        grammar = ArgumentGrammar(grammars, self.vocab, self.eos)
        grammar.matchers, grammar.started, grammar.states, grammar.batch = matchers, started, states, self.batch
        return grammar

    def routed(self, states: torch.Tensor) -> None:
        """Keep the states (rows, width) that picked the tokens ``advance`` is fed next, for the rows that have
        key-set rows (their memory tokens start the key set the state chooses: ``KeySetGrammars``)."""
        for i in self.keyed:
            self.states[i] = states[i]

    def advance(self, tokens: torch.Tensor) -> None:
        """Feed each row's new token: a memory token starts its tool's grammar (or none); EOS ends the row's; a
        context id after a memory token (``tokmem.bank.memory_ids``: past the row's bank rows) changes nothing."""
        tokens = tokens.tolist()
        for i, token in enumerate(tokens):
            self.started[i] = True
            if self.vocab <= token < self.vocab + len(self.grammars[i]):
                self._start_tool(i, token)
            elif token == self.eos:
                self.matchers[i] = None
        fed = [i for i, token in enumerate(tokens) if token < self.vocab and self.matchers[i] is not None]
        accepted = xgrammar.BatchGrammarMatcher.batch_accept_token(
            [self.matchers[i] for i in fed], [tokens[i] for i in fed]
        )
        for i, ok in zip(fed, accepted):
            if not ok:  # only where the mask was not applied (a forced or replayed token): the row goes free
                self.matchers[i] = None

    def begin(self, memory: list[int]) -> None:
        """Start each row whose memory token is already in its context (``memory[i]``, or -1: none) in that tool's
        grammar, its arguments next (a bank that shows schemas: ``tokmem.chat`` decodes the arguments after the
        memory token and the schema)."""
        for i, token in enumerate(memory):
            if token >= 0:
                self.started[i] = True
                self._start_tool(i, token)

    def _start_tool(self, i: int, memory: int) -> None:
        compiled = self.grammars[i][memory - self.vocab]
        if isinstance(compiled, KeySetGrammars):
            compiled = compiled.chosen(self.states[i])
        self.matchers[i] = None if compiled is None else xgrammar.GrammarMatcher(compiled)

    def constrain(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` over vocab ∪ bank with each constrained row's disallowed tokens at -inf (in place).

        The packed bitmask (32 tokens a word) goes to the logits' device and xgrammar's kernel applies it there:
        unpacking a large vocabulary into booleans on the host costs more than the step."""
        active = [i for i, m in enumerate(self.matchers) if m is not None]
        if not active:
            return logits
        bitmask = xgrammar.allocate_token_bitmask(len(self.matchers), self.vocab)
        self.batch.batch_fill_next_token_bitmask([self.matchers[i] for i in active], bitmask, indices=active)
        words = bitmask[active]
        stuck = ~_any_token(words, self.vocab)  # a grammar with no way on (a schema that admits no value): goes free
        if stuck.any():
            for k in stuck.nonzero().flatten().tolist():
                self.matchers[active[k]] = None
            return self.constrain(logits)
        xgrammar.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), vocab_size=self.vocab, indices=active)
        # the JSON is complete (the next call's memory token may follow), or the row has no token yet (routing decides)
        complete = (words[:, self.eos // 32] >> (self.eos % 32)) & 1
        memory = complete.bool() | ~torch.tensor([self.started[i] for i in active])
        rows = torch.tensor(active, device=logits.device)
        closed = ~memory.to(logits.device).unsqueeze(-1)
        logits[rows, self.vocab :] = logits[rows, self.vocab :].masked_fill(closed, float("-inf"))
        return logits


def _any_token(words: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Per row of a packed bitmask, whether it allows any of the first ``vocab_size`` tokens."""
    words = words[:, : (vocab_size + 31) // 32].clone()
    spare = 32 * words.shape[1] - vocab_size  # bits past the vocabulary in the last word
    if spare:
        words[:, -1] &= (1 << (32 - spare)) - 1
    return (words != 0).any(-1)
