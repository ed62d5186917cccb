"""Index refit: after training, fit the trained rows' routing side to the states their own examples reach.

Why: a coupled row is one vector that both routes (an LM-head row) and steers what follows it (an input row).
Trained a few hundred updates by both losses, such rows route a fifth of their own training calls wrong on the 0.5B
tool loop, while output rows fitted to the same states route all of them and most new ones (research/docs/studies.md,
"Causes").  The backbone is frozen and the input rows stay as trained, so the state before each memory token is
fixed: the index side can be fitted on those states alone, cheaply — one pass of the backbone over the examples
without gradients, then full-batch steps on (states × rows).  The bank becomes decoupled (``MemoryBank.decouple``):
its trained rows keep steering, the refit rows route.

The loss is training's at those positions: cross-entropy over the vocabulary and the bank, the vocabulary's logits
fixed (one log-sum-exp a state), so the refit rows keep their scale against the words (``tool_choice="auto"`` and the
open-set rule still compare them), and a position that learns to answer in words (``ANSWER``) still does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from tokmem.model import TokMemModel
from tokmem.sequences import ANSWER, Encoded, collate, to_device

REFIT_STEPS, REFIT_LR = 2000, 1e-3  # Adam, full batch: all 391 training calls of the 0.5B tool loop routed


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
    return {"states": len(found.rows), "routed_before": before, "routed_after": found.routed(bank.index)}
