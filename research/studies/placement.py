"""Memory placement: TokMem's infix memory vs prefix tuning (the paper's "Analysis on Memory Placement").

With routing switched off TokMem is prompt tuning with an *infix* placement, where prefix tuning
places the same trainable embeddings before the query:

    TokMem-n          chat(query)  M_1 … M_n  response
    Prefix tuning-n   P_1 … P_n  chat(query)  response

Both train n rows initialised to the mean input embedding, with the same optimiser, data, order
and steps.  TokMem-n is n consecutive memory tokens of one procedure: bank rows ``text#0`` … forced
after the query.  The memory tokens are inputs here, not targets (there is nothing to route to),
so in both methods only the response is a target.  The rows of TokMem stay output classes of its
LM head as always, prefix rows never are (`research.methods.prefix`).

This module lays the two placements out; two studies compare them: memorisation
(`research.studies.memorization`) and GSM8K format compliance (`research.studies.gsm8k_placement`).
"""

from __future__ import annotations

import tokmem
from tokmem.backbones import Backbone
from research.methods import prefix
from tokmem.model import TokMemModel
from tokmem.training.sequences import IGNORE, Encoded, chat_prefix, chat_turns

METHODS = ("prefix", "tokmem")
LABELS = {"prefix": "Prefix tuning", "tokmem": "TokMem"}


def build(method: str, tokens: int, backbone: Backbone, name: str = "text") -> TokMemModel:
    """A fresh model with ``tokens`` trainable rows: a prefix, or TokMem rows ``name#0`` …."""
    if method == "prefix":
        return prefix.create(backbone, tokens)
    model = tokmem.create(backbone)
    model.bank.add(prefix.row_names(name, tokens), backbone.mean_embedding())
    return model


def context(model: TokMemModel, method: str, query: str, layout: str = "assistant") -> list[int]:
    """What comes before the target: prefix tuning's P ⊕ chat(query) in either layout; TokMem's
    chat(query) ⊕ M (``assistant``: after the assistant header) or user turn ⊕ M ⊕ assistant header (``reference``)."""
    if method == "prefix":
        return prefix.context(model, query)
    tokenizer = model.backbone.tokenizer
    memory = [model.memory_id(n) for n in model.bank.names]
    if layout == "reference":
        turn, header = chat_turns(tokenizer, query)
        return turn + memory + header
    return chat_prefix(tokenizer, query) + memory


def lay_out(model: TokMemModel, method: str, query: str, target: list[int], layout: str = "assistant") -> Encoded:
    """The method's sequence for one (query, target) pair; only the target is labelled."""
    return targeted(context(model, method, query, layout), target)


def targeted(before: list[int], target: list[int]) -> Encoded:
    """``before`` then ``target``; only the target is labelled."""
    return Encoded(before + target, [IGNORE] * len(before) + target)
