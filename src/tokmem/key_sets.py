"""Key-set rows: which of its keys a tool call writes, chosen where the tool is routed.

Why: a call leaves out or adds its tool's optional keys (ComplexFuncBench's ``sortBy``, ``children_age``) as its
query asks, but one memory row a tool writes the keys its training calls wrote most (wrong key sets were 12 to 14 of
the 80 steps of the 0.5B tool loop, where LoRA reads the query).  Yet the frozen state before the memory token holds
the key set linearly: a logistic regression on it named 79 and 80 of 80 test calls' key sets at seeds 1 and 2, and
the arguments bound to what it named scored 37 and 34 exact steps where the bank alone scored 33 and 31
(research/docs/studies.md, "The key set is in the routing state").

So a tool whose training calls write several key sets gets an index row and a bias per key set, its *key-set rows*
(``KeySets``): once the tool's memory token is picked, the state that picked it chooses among them (the largest
``weight @ state + bias``), and the arguments decode under the tool's schema narrowed to that key set (``narrowed``:
each of its keys required, no other; ``tokmem.grammar``).  Routing is two-stage, the tool's own index row and then
its key-set row, so the tool's rows, name and memory id stay as they are and its key sets share its steer row.

They are fitted after training, as the routing refit is (``tokmem.refit``), on the frozen states before each of the
tool's training calls (``call_key_sets`` reads each call's keys off its labels): a multinomial logistic regression
(standardised states, scikit-learn's default L2 strength, L-BFGS), folded back to weights on the raw state.  A tool
whose training calls write one key set gets none: the schema the bank learned binds it already
(``schemas.learned_schema``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from tokmem.sequences import ANSWER, IGNORE, Encoded

if TYPE_CHECKING:  # the bank file reads KeySets; the refit module reads the bank
    from tokmem.refit import RoutingStates

FIT_ITERATIONS = 500  # L-BFGS iterations of one tool's fit (a few dozen states: converges well within)


@dataclass
class KeySets:
    """A tool's key sets (each its keys in the tool's schema order) and their rows: ``weight`` (key sets, width) and
    ``bias`` (key sets,), float32 on the CPU."""

    keys: list[tuple[str, ...]]
    weight: torch.Tensor
    bias: torch.Tensor

    def scores(self, state: torch.Tensor) -> torch.Tensor:
        """Each key set's score at ``state`` (the hidden state that routed the tool): (key sets,)."""
        return self.weight @ state.detach().float().cpu() + self.bias


def narrowed(schema: dict, keys: tuple[str, ...]) -> dict | None:
    """``schema`` (a tool's arguments) admitting exactly ``keys``, each required; None when it names a key the schema
    has no property for (a client's schema that leaves it out), or the schema is not a plain object of properties."""
    properties = schema.get("properties")
    if "$ref" in schema or not isinstance(properties, dict) or not set(keys) <= set(properties):
        return None
    kept = {name: spec for name, spec in properties.items() if name in keys}
    return {"type": "object", "properties": kept, "required": list(kept)}


def call_key_sets(encoded: list[Encoded], vocab_size: int, eos: int, tokenizer) -> list[frozenset | None]:
    """Per memory-token or ``ANSWER`` label of ``encoded`` (``refit.routing_states``' order), the keys of the
    arguments JSON its labels go on with (the tokens up to EOS, past the context ids after the memory token), or None
    (an answer in words, a text procedure's response, or arguments cut by truncation)."""
    found = []
    for sequence in encoded:
        labels = sequence.labels
        for position, label in enumerate(labels[1:], start=1):
            if label == ANSWER:
                found.append(None)
            elif label >= vocab_size:
                tokens = []
                for following in labels[position + 1 :]:
                    if following == eos or following >= vocab_size or (following == IGNORE and tokens):
                        break
                    if following >= 0:
                        tokens.append(following)
                found.append(_keys(tokenizer.decode(tokens)))
    return found


def _keys(text: str) -> frozenset | None:
    try:
        arguments = json.loads(text)
    except ValueError:
        return None
    return frozenset(arguments) if isinstance(arguments, dict) else None


def fit_key_sets(bank, found: RoutingStates, key_sets: list[frozenset | None], rows=None) -> dict:
    """Give each tool row of ``bank`` with a schema among ``rows`` (default: the trainable ones) the key-set rows of
    its training calls (``found``: their routing states; ``key_sets``: ``call_key_sets`` of the same sequences), where
    they write several; returns how many tools got them, how many key sets, and how many of those calls the rows
    choose right."""
    tools, fitted, right, calls = 0, 0, 0, 0
    labelled = found.rows.tolist()
    for row in (bank.trainable_rows() if rows is None else rows).tolist():
        schema = bank.schemas[row]
        picked = [i for i, r in enumerate(labelled) if r == row and key_sets[i] is not None]
        distinct = sorted({key_sets[i] for i in picked}, key=sorted)
        bank.key_sets[row] = None
        if not bank.is_tool(row) or schema is None or len(distinct) < 2:
            continue
        order = list(schema.get("properties") or {})
        keys = [(*(key for key in order if key in k), *sorted(k - set(order))) for k in distinct]
        labels = torch.tensor([distinct.index(key_sets[i]) for i in picked])
        weight, bias = logistic_regression(found.states[picked], labels, len(distinct))
        bank.key_sets[row] = KeySets(keys, weight, bias)
        chosen = (found.states[picked] @ weight.T + bias).argmax(1)
        tools, fitted, calls = tools + 1, fitted + len(keys), calls + len(picked)
        right += int((chosen == labels).sum())
    return {"tools": tools, "key_sets": fitted, "calls": calls, "chosen_right": right}


def fit_model_key_sets(model, found: RoutingStates, encoded: list[Encoded], rows=None) -> dict:
    """``fit_key_sets`` for ``model``'s bank on ``found``, the routing states of its training sequences ``encoded``."""
    tokenizer = model.backbone.tokenizer
    key_sets = call_key_sets(encoded, model.vocab_size, model.backbone.eos_token_id, tokenizer)
    return fit_key_sets(model.bank, found, key_sets, rows)


def logistic_regression(states: torch.Tensor, labels: torch.Tensor, classes: int, strength: float = 1.0):
    """A multinomial logistic regression from ``states`` (n, d) to ``labels`` (n,) in ``range(classes)``, fitted on
    standardised states with scikit-learn's objective (mean cross-entropy + ||W||² / (2 · ``strength`` · n), the
    bias free) by L-BFGS, then folded back: (weight (classes, d), bias (classes,)) on the raw states, float32."""
    states = states.double()
    mean, scale = states.mean(0), states.std(0, unbiased=False)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    x = (states - mean) / scale
    weight = torch.zeros(classes, x.shape[1], dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(classes, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], max_iter=FIT_ITERATIONS, line_search_fn="strong_wolfe")

    def loss():
        optimizer.zero_grad()
        value = torch.nn.functional.cross_entropy(x @ weight.T + bias, labels)
        value = value + weight.square().sum() / (2 * strength * len(x))
        value.backward()
        return value

    optimizer.step(loss)
    raw = (weight / scale).detach()
    return raw.float(), (bias.detach() - raw @ mean).float()
