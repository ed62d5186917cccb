"""Streamed answers: the text so far, decoded incrementally, and the deltas that go out.

``IncrementalText`` splits a request's tokens into segments as ``tokmem.decoding.decode`` does and decodes each
token once: per segment it keeps a short window of recent tokens and decodes only that window (the
text of a byte-level tokenizer is the concatenation of its windows' texts), so an update costs the
new tokens, not the whole answer.  ``Deltas`` sends only text that will not change; ``StopSequences``
cuts a text answer at a request's ``stop`` sequences.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tokmem.decoding.tool_rules import call_id
from tokmem.data.procedures import assemble_call


class _Segment:
    """One segment's text as its tokens arrive.

    ``text`` is the decoded text of ``ids[:read]``; ``ids[start:read]`` is the window last decoded, kept as
    context for the next tokens.  The window moves on once its text ends with a whole character, or once
    ``SETTLE`` tokens have not completed one (the bytes are invalid for good), so each update decodes a few
    tokens only."""

    SETTLE = 4  # a UTF-8 character has at most 4 bytes, and a byte-level token at least one

    def __init__(self, row: int | None):
        self.row, self.ids, self.text, self.start, self.read = row, [], "", 0, 0

    def current(self, tokenizer) -> str:
        """The segment's text so far (possibly ending in U+FFFD, a character still missing bytes)."""
        before = tokenizer.decode(self.ids[self.start : self.read], skip_special_tokens=True)
        now = tokenizer.decode(self.ids[self.start :], skip_special_tokens=True)
        tail = now[len(before) :]
        if tail and (not now.endswith("\ufffd") or len(self.ids) - self.read >= self.SETTLE):
            self.text, tail = self.text + tail, ""
            self.start, self.read = self.read, len(self.ids)
        return self.text + tail


class IncrementalText:
    """The answer's text (``Generation.text``) of a growing token list, decoding each new token once."""

    def __init__(self, model):
        self.model = model
        self.segments: list[_Segment] = []
        self.seen = 0
        self.ended = False

    def update(self, tokens: list[int]) -> str:
        self._feed(tokens)
        return "\n".join(self._segment_text(s) for s in self.segments)

    def calls(self, tokens: list[int]) -> list[tuple[str, str]]:
        """(tool name, arguments so far) per segment of an answer that is tool calls
        (``tokmem.decoding.tool_rules.reply_from``'s)."""
        self._feed(tokens)
        tokenizer, names = self.model.backbone.tokenizer, self.model.bank.names
        return [(names[s.row], s.current(tokenizer).strip()) for s in self.segments]

    def _feed(self, tokens: list[int]) -> None:
        vocab, eos = self.model.vocab_size, self.model.backbone.eos_token_id
        for token in self.model.without_context(tokens[self.seen :]):
            if self.ended or token == eos:
                self.ended = True
            elif token >= vocab:
                self.segments.append(_Segment(token - vocab))
            else:
                if not self.segments:  # an open-set answer: the plain backbone's text, no memory token first
                    self.segments.append(_Segment(None))
                self.segments[-1].ids.append(token)
        self.seen = len(tokens)

    def _segment_text(self, segment: _Segment) -> str:
        text, bank = segment.current(self.model.backbone.tokenizer).strip(), self.model.bank
        if segment.row is not None and bank.is_tool(segment.row):
            return assemble_call(bank.names[segment.row], text)
        return text


class CallDeltas:
    """Streamed tool calls as OpenAI streams them: a call's first delta carries its ``index``, ``id``, ``type`` and
    ``function.name`` (and the arguments so far), later ones ``index`` and more ``function.arguments``; arguments go
    out as ``Deltas`` settle them."""

    def __init__(self, turn: int):
        self.turn = turn
        self.sent: list[Deltas] = []

    def update(self, calls: list[tuple[str, str]]) -> list[dict]:
        return self._deltas(calls, final=False)

    def final(self, calls: list[tuple[str, str]]) -> list[dict]:
        """The rest of each call, from the whole answer's calls."""
        return self._deltas(calls, final=True)

    def _deltas(self, calls: list[tuple[str, str]], final: bool) -> list[dict]:
        out = []
        for k, (name, arguments) in enumerate(calls):
            new = k == len(self.sent)
            if new:
                self.sent.append(Deltas())
            piece = self.sent[k].final(arguments) if final else self.sent[k].update(arguments)
            if new:
                out.append(
                    {
                        "index": k,
                        "id": call_id(self.turn, k),
                        "type": "function",
                        "function": {"name": name, "arguments": piece},
                    }
                )
            elif piece:
                out.append({"index": k, "function": {"arguments": piece}})
        return out


class Deltas:
    """Streamed text that is never taken back.

    Only what two successive decodings agree on goes out, short of trailing U+FFFD (a UTF-8 character
    still missing bytes); the rest goes when the answer is final.  Text that ``decode`` assembles
    around a segment may also change as tokens arrive.
    """

    def __init__(self):
        self.sent = self.previous = ""

    def update(self, text: str) -> str:
        stable, self.previous = os.path.commonprefix([self.previous, text]).rstrip("\ufffd"), text
        return self.final(stable)

    def final(self, text: str) -> str:
        if len(text) <= len(self.sent) or not text.startswith(self.sent):
            return ""
        delta, self.sent = text[len(self.sent) :], text
        return delta


@dataclass(frozen=True)
class StopSequences:
    """OpenAI's ``stop``: a text answer ends before the first of these sequences (none: it never does)."""

    sequences: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.sequences)

    def end(self, text: str) -> int | None:
        """Where the first stop sequence in ``text`` begins, or None."""
        found = [i for i in (text.find(s) for s in self.sequences) if i >= 0]
        return min(found) if found else None

    def cut(self, text: str, final: bool = True) -> str:
        """``text`` up to its first stop sequence; unless ``final``, also short of an ending that may begin one
        (a stream must not send what a later token may turn into a stop sequence)."""
        end = self.end(text)
        if end is not None:
            return text[:end]
        if final:
            return text
        partial = max((k for s in self.sequences for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        return text[: len(text) - partial]
