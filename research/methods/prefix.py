"""Prefix tuning: n trainable input embeddings placed before the chat-formatted query.

    P_1 … P_n  chat(query)  response  EOS

This is prompt tuning with a *prefix* placement, as PEFT's prompt tuning does it (virtual tokens
before the whole input).  It is built on TokMemModel rather than PEFT so that it keeps TokMem's
frozen-backbone contract and shares its machinery: the n embeddings are bank rows ``prefix#0`` …,
initialised like memory rows to the mean input embedding, they are the only trainable parameters
(n × hidden size, as many as TokMem with n memory tokens), and training runs through
`tokmem.train.fit`.  Unlike memory tokens they are inputs only: they never enter the LM head, so
the model predicts over the vocabulary alone, and only the response (and EOS) is a target.
"""

from __future__ import annotations

import torch

import tokmem
from tokmem.backbones import Backbone
from tokmem.data.procedures import Example
from tokmem.decoding.decode import DecodeConfig, complete
from tokmem.training.sequences import IGNORE, Encoded, chat_prefix
from tokmem.model import TokMemModel
from tokmem.training.train import TrainConfig, TrainReport, fit

NAME = "prefix"


class PrefixTuning(TokMemModel):
    """A TokMemModel whose rows are input embeddings only, placed before the query."""

    def logits(self, hidden: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
        """Vocabulary logits only: the prefix rows are never output classes."""
        return self.lm.get_output_embeddings()(hidden)

    def prefix_ids(self) -> list[int]:
        return [self.vocab_size + row for row in range(len(self.bank))]


def row_names(name: str, tokens: int) -> list[str]:
    """Names of ``tokens`` consecutive rows that act as one unit: ``name#0`` … ``name#{tokens-1}``."""
    return [f"{name}#{i}" for i in range(tokens)]


def create(backbone: str | Backbone, tokens: int = 1, **load_options) -> PrefixTuning:
    """A prefix of ``tokens`` trainable embeddings, each initialised to the backbone's mean input embedding."""
    base = tokmem.create(backbone, **load_options)
    model = PrefixTuning(base.backbone, base.bank)
    model.bank.add(row_names(NAME, tokens), model.backbone.mean_embedding())
    return model


def context(model: PrefixTuning, query: str) -> list[int]:
    """P_1 … P_n ⊕ chat(query): what comes before the answer."""
    return model.prefix_ids() + chat_prefix(model.backbone.tokenizer, query)


def encode(model: PrefixTuning, query: str, target: list[int]) -> Encoded:
    """P_1 … P_n ⊕ chat(query) ⊕ target; only the target is labelled."""
    before = context(model, query)
    return Encoded(before + target, [IGNORE] * len(before) + target)


def response_ids(tokenizer, text: str) -> list[int]:
    """The target of an answer: its tokens and EOS."""
    return tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def train(model: PrefixTuning, examples: list[Example], config: TrainConfig | None = None) -> TrainReport:
    """Fit the prefix to each example's whole answer (its steps' responses, one per line).

    Sequences are not truncated: ``config.max_length`` does not apply.
    """
    tokenizer = model.backbone.tokenizer
    encoded = [encode(model, e.query, response_ids(tokenizer, e.response)) for e in examples]
    return fit(model, encoded, config)


def generate(model: PrefixTuning, queries: list[str], config: DecodeConfig | None = None) -> list[str]:
    """Answer each query after P ⊕ chat(query) (`tokmem.decode.complete`: greedy unless ``config.temperature`` > 0)."""
    return complete(model, [context(model, q) for q in queries], config)
