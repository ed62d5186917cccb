"""Stopping rules of the offline decoding loop (``decode.decode_rows``), as hooks: each rule's ``update(token)`` takes
every row's new token and says which rows it ends.  EOS always ends a row (``EndOfSequence``); ``generate`` adds
``BlankLineStop`` for prompted answers (``DecodeConfig.stop_at_blank_line``).  (The server ends each request by its
own rules as its tokens arrive: ``serve.engine.Handle``.)"""

from __future__ import annotations

import functools

import torch


class EndOfSequence:
    """Ends the rows whose new token is EOS."""

    def __init__(self, eos: int):
        self.eos = eos

    def update(self, token: torch.Tensor) -> torch.Tensor:
        return token == self.eos


def stopped(stops: list, token: torch.Tensor) -> torch.Tensor:
    """The rows that one of ``stops`` ends at ``token`` (every rule sees every token)."""
    done = torch.zeros_like(token, dtype=torch.bool)
    for stop in stops:
        done |= stop.update(token)
    return done


class BlankLineStop:
    """Finds the rows whose text has reached a blank line (``"\n\n"``) after its first non-blank character.

    Prompted baselines separate requests with a blank line and keep an answer's text up to it (``first_block``),
    so decoding a row further is wasted work.  A blank line lies within one token or across two (one ending,
    the next starting with a newline); the tables say which tokens do what, over the vocabulary's texts.
    """

    def __init__(self, tokenizer, vocab: int, device):
        self.vocab = vocab
        self.tables = [table.to(device) for table in _newline_tables(tokenizer, vocab)]
        self.started = self.after_newline = None  # per row: some text seen; the text so far ends with a newline

    def update(self, token: torch.Tensor) -> torch.Tensor:
        """Feed each row's new token; True for the rows whose text now has a blank line after some text."""
        is_text = token < self.vocab  # memory tokens are no text
        t = token.clamp(max=self.vocab - 1)
        blank, blank_after_text, has_text, ends, starts = (table[t] & is_text for table in self.tables)
        if self.started is None:
            self.started, self.after_newline = torch.zeros_like(is_text), torch.zeros_like(is_text)
        stop = torch.where(self.started, blank | (self.after_newline & starts), blank_after_text)
        self.started = self.started | has_text
        self.after_newline = torch.where(is_text, ends, self.after_newline)
        return stop


@functools.lru_cache(maxsize=4)
def _newline_tables(tokenizer, vocab: int) -> tuple[torch.Tensor, ...]:
    """Per token: has a blank line; has one after its first non-blank character; has a non-blank character;
    ends with a newline; starts with one."""
    texts = [tokenizer.decode([i]) for i in range(vocab)]
    rows = [("\n\n" in t, "\n\n" in t.lstrip(), bool(t.strip()), t.endswith("\n"), t.startswith("\n")) for t in texts]
    return tuple(torch.tensor(column, dtype=torch.bool) for column in zip(*rows))
