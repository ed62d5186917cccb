"""After training, two fits on the states the trained rows' own examples reach (one pass of the frozen backbone).

* Index refit (``refit_index``): a coupled row is one vector that both routes (an LM-head row) and steers what follows
  it (an input row); trained by both losses it routes some of its own training calls wrong, while an output row
  fitted to the states before those calls routes them (docs/tools.md, "Routing refit after training").  The backbone
  is frozen and the input rows stay as trained, so the state before each memory token is fixed: the index side is
  fitted on those states alone, by full-batch steps on (states × rows).  The bank becomes decoupled
  (``MemoryBank.decouple``): its trained rows keep steering, the refit rows route.  The loss is training's at those
  positions: cross-entropy over the vocabulary and the bank, the vocabulary's logits fixed (one log-sum-exp a state),
  so the refit rows keep their scale against the words (``tool_choice="auto"`` and the open-set rule still compare
  them), and a position that learns to answer in words (``ANSWER``) still does.
* Key-set rows (``fit_key_sets``, the type ``tokmem.bank.key_sets.KeySets``): per tool whose training calls write
  several key sets, a multinomial logistic regression from the state that routed each call to its key set
  (``call_key_sets`` reads each call's keys off its labels; standardised states, scikit-learn's default L2 strength,
  L-BFGS), folded back to weights on the raw state.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from tokmem.bank.key_sets import KeySets
from tokmem.model import TokMemModel
from tokmem.training.sequences import ANSWER, IGNORE, Encoded, collate, to_device

REFIT_STEPS, REFIT_LR = 2000, 1e-3  # Adam, full batch (docs/tools.md, "Routing refit after training")
FIT_ITERATIONS = 500  # L-BFGS iterations of one tool's key-set fit (a few dozen states: converges well within)


@dataclass
class RoutingStates:
    """The final hidden state before each memory-token label of some sequences (n, d), the label's bank row (-1:
    answer in words), and the log-sum-exp of the vocabulary's logits there (n,)."""

    states: torch.Tensor
    rows: torch.Tensor
    words: torch.Tensor

    def logits(self, index: torch.Tensor) -> torch.Tensor:
        """(n, 1 + rows): the vocabulary as one column (its log-sum-exp), then each bank row's logit."""
        return torch.cat([self.words.unsqueeze(1), self.states @ index.T], dim=1)

    def routed(self, index: torch.Tensor) -> int:
        """How many states the rows ``index`` route to their label (the vocabulary, for an answer in words)."""
        return int((self.logits(index).argmax(1) == self.rows + 1).sum())


@torch.no_grad()
def routing_states(
    model: TokMemModel, encoded: list[Encoded], batch_size: int = 4, progress: bool = True
) -> RoutingStates:
    """The states before each memory-token label of ``encoded`` (laid out as training lays them out), each sequence
    read once, in the backbone's own dtype as decoding reads it."""
    pad = model.backbone.tokenizer.pad_token_id
    head = model.lm.get_output_embeddings()
    steer = model.memory_matrices()[1]
    found = {"states": [], "rows": [], "words": []}
    for start in tqdm(range(0, len(encoded), batch_size), desc="routing states", unit="batch", disable=not progress):
        batch = to_device(collate(encoded[start : start + batch_size], pad), model.device)
        hidden, _ = model.hidden(batch["input_ids"], batch["attention_mask"], steer=steer)
        labels = batch["labels"][:, 1:]
        where = (labels >= model.vocab_size) | (labels == ANSWER)
        states = hidden[:, :-1][where]
        found["states"].append(states.float().cpu())
        found["rows"].append(torch.where(labels[where] == ANSWER, -1, labels[where] - model.vocab_size).cpu())
        found["words"].append(head(states).float().logsumexp(-1).cpu())
    return RoutingStates(*(torch.cat(found[name]) for name in ("states", "rows", "words")))


def fit_index(
    found: RoutingStates, index: torch.Tensor, rows: torch.Tensor, steps: int = REFIT_STEPS, device="cpu"
) -> torch.Tensor:
    """``index`` (all rows, d) with its ``rows`` refit on ``found`` (the others fixed, in the softmax): Adam at
    ``REFIT_LR``, full batch, from their present values, on ``device``; returned on the CPU."""
    found = RoutingStates(*(t.to(device) for t in (found.states, found.rows, found.words)))
    index, rows = index.detach().float().to(device), rows.to(device)
    fitted = index[rows].clone().requires_grad_(True)
    optimizer = torch.optim.Adam([fitted], lr=REFIT_LR)
    targets = found.rows + 1
    for _ in range(steps):
        optimizer.zero_grad()
        logits = found.logits(index.index_copy(0, rows, fitted))
        torch.nn.functional.cross_entropy(logits, targets).backward()
        optimizer.step()
    return index.index_copy(0, rows, fitted.detach()).cpu()


def refit_index(model: TokMemModel, found: RoutingStates) -> dict:
    """Refit the bank's trainable rows' index side on ``found`` (``routing_states`` of their training sequences) and
    make the bank decoupled; returns how many of those states routed right before and after (against the vocabulary
    too)."""
    bank = model.bank
    rows = bank.trainable_rows()
    before = found.routed(bank.index)
    index = fit_index(found, bank.index, rows, device=model.device)
    bank.decouple()
    bank.index[rows] = index[rows]
    routed = {"routed_before": before, "routed_after": found.routed(bank.index)}
    return {"states": len(found.rows), "steps": REFIT_STEPS} | routed


def call_key_sets(encoded: list[Encoded], vocab_size: int, eos: int, tokenizer) -> list[frozenset | None]:
    """Per memory-token or ``ANSWER`` label of ``encoded`` (``routing_states``' order), the keys of the
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
    fits = {"tools": tools, "key_sets": fitted, "calls": calls, "chosen_right": right}
    return fits | {"iterations_at_most": tools * FIT_ITERATIONS}  # L-BFGS, one fit a tool


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
