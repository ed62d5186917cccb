"""TokMemModel: a frozen backbone plus a memory bank.

Memory token ids are ``vocab_size + row``; a bank's tails and shared rows have ids after its rows
(``tokmem.bank.memory_ids``).  The vocabulary is never resized and the embedding
matrix never unfrozen: memory ids are looked up in the bank, and the LM head's logits are
extended with ``h · Mᵀ``.  During training, the bank's trainable rows are the only parameters (their loss:
``tokmem.training.loss``).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import DynamicCache

from tokmem.backbones import DEFAULT_BACKBONE, Backbone
from tokmem.bank.memory_bank import MEMORY_TOKENS, SHARED_TOKENS, MemoryBank
from tokmem.bank.memory_ids import input_rows, tail_ids
from tokmem.errors import BankError


class TokMemModel(nn.Module):
    def __init__(self, backbone: Backbone, bank: MemoryBank):
        super().__init__()
        self.backbone = backbone
        self.bank = bank
        self.lm = backbone.model
        self.row_index: nn.Parameter | None = None
        self.row_steer: nn.Parameter | None = None
        self.row_tail: nn.Parameter | None = None
        self.row_shared: nn.Parameter | None = None
        self._rows: torch.Tensor | None = None

    @property
    def vocab_size(self) -> int:
        return self.backbone.vocab_size

    @property
    def device(self) -> torch.device:
        return self.backbone.device

    def memory_id(self, name: str) -> int:
        return self.vocab_size + self.bank.row(name)

    def tail_ids(self, memory: int) -> list[int]:
        """The ids that follow memory token ``memory``: its tail (none in a bank of one memory token a procedure),
        then the bank's shared rows (none in a bank without): input rows only, never predicted."""
        bank = self.bank
        return tail_ids(self.vocab_size, len(bank), bank.memory_tokens - 1, bank.shared_tokens, memory)

    def is_memory(self, ids: torch.Tensor) -> torch.Tensor:
        return ids >= self.vocab_size

    def without_context(self, tokens: list[int]) -> list[int]:
        """An answer's tokens without the context ids its decoder laid out after each memory token (its tail, the
        shared rows): what the model wrote."""
        end = self.vocab_size + len(self.bank)
        return [token for token in tokens if token < end]

    # ---- trainable rows ---------------------------------------------------------------------------
    def unfreeze_rows(self) -> list[nn.Parameter]:
        """Make the bank's trainable rows the model's only parameters; returns them for the optimiser."""
        self._rows = self.bank.trainable_rows().to(self.device)
        self.row_index = nn.Parameter(self.bank.index[self._rows.cpu()].to(self.device))
        if self.bank.decoupled:
            self.row_steer = nn.Parameter(self.bank.steer[self._rows.cpu()].to(self.device))
        if self.bank.memory_tokens > 1:
            self.row_tail = nn.Parameter(self.bank.tail[self._rows.cpu()].to(self.device))
        if self.bank.shared_trainable:
            self.row_shared = nn.Parameter(self.bank.shared.to(self.device, copy=True))
        return [p for p in (self.row_index, self.row_steer, self.row_tail, self.row_shared) if p is not None]

    def write_rows(self) -> None:
        """Copy the live trainable rows into the bank (e.g. for a checkpoint); training goes on."""
        rows = self._rows.cpu()
        self.bank.index[rows] = self.row_index.detach().float().cpu()
        if self.row_steer is not None:
            self.bank.steer[rows] = self.row_steer.detach().float().cpu()
        if self.row_tail is not None:
            self.bank.tail[rows] = self.row_tail.detach().float().cpu()
        if self.row_shared is not None:
            self.bank.shared = self.row_shared.detach().float().cpu()

    def commit_rows(self) -> None:
        """Write the trained rows back into the bank and drop the parameters."""
        self.write_rows()
        self.row_index = self.row_steer = self.row_tail = self.row_shared = self._rows = None

    @torch.no_grad()
    def renormalize_live_rows(self, target: float, eps: float = 1e-8, side: str = "index") -> None:
        """Rescale one ``side`` of the live trainable rows to L2 norm ``target`` (the bank's ``renormalize``,
        mid-training)."""
        rows = self.row_steer if side == "steer" and self.row_steer is not None else self.row_index
        rows.mul_(target / (rows.norm(dim=1, keepdim=True) + eps))

    def memory_matrices(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(index, steer) over all rows on the model's device, with trainable rows as live parameters; a bank of
        several memory tokens a procedure has its tails after the rows in ``steer``, and its shared rows after them
        (``tail_ids``)."""
        index = self._with_rows(self.bank.index, self.row_index)
        steer = self._with_rows(self.bank.steer, self.row_steer) if self.bank.decoupled else index
        if self.bank.context_rows():
            tail = self._with_rows(self.bank.tail, self.row_tail)
            shared = self.bank.shared.to(self.device) if self.row_shared is None else self.row_shared
            steer = input_rows(steer, tail, shared)
        return index, steer

    def _with_rows(self, matrix: torch.Tensor, rows: nn.Parameter | None) -> torch.Tensor:
        matrix = matrix.to(self.device)
        return matrix if rows is None else matrix.index_copy(0, self._rows, rows)

    # ---- the two places the bank enters the network ---------------------------------------------------
    def embed(self, ids: torch.Tensor, steer: torch.Tensor | None = None) -> torch.Tensor:
        """Input embeddings for ids over vocab ∪ bank (see ``embed_ids``)."""
        if steer is None:
            steer = self.memory_matrices()[1]
        return embed_ids(ids, self.vocab_size, self.lm.get_input_embeddings(), steer)

    def logits(
        self, hidden: torch.Tensor, index: torch.Tensor | None = None, valid: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Logits over vocab ∪ bank: the LM head's, then ``h · indexᵀ`` (see ``memory_logits``)."""
        if index is None:
            index = self.memory_matrices()[0]
        return torch.cat([self.lm.get_output_embeddings()(hidden), self.memory_logits(hidden, index, valid)], dim=-1)

    @staticmethod
    def memory_logits(hidden: torch.Tensor, index: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """``h · indexᵀ``: ``index`` is the bank's (rows, d) output side, or (batch, rows, d) for ``hidden``
        (batch, d), each batch row its own bank; ``valid`` (batch, rows): the columns a batch row may use (required
        with per-row banks: their padding), the others get -inf."""
        if index.dim() == 2:
            logits = hidden @ index.to(hidden.dtype).T
        else:
            logits = torch.einsum("bd,brd->br", hidden, index.to(hidden.dtype))
        return logits if valid is None else logits.masked_fill(~valid, float("-inf"))

    def hidden(self, ids, attention_mask, position_ids=None, past_key_values=None, steer=None):
        """Final hidden states (after the backbone's last norm) and the updated KV cache."""
        out = self.lm.base_model(
            inputs_embeds=self.embed(ids, steer),
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=past_key_values is not None,
        )
        return out.last_hidden_state, out.past_key_values

    def prefix_cache(self, ids: torch.Tensor, steer: torch.Tensor | None = None) -> DynamicCache:
        """The KV cache of one row of ids (1, s) that every row of a batch starts with: encoded once, then repeated
        for the batch's rows (training) or copied into each batch (``decode.generate``)."""
        mask = torch.ones_like(ids)
        return self.hidden(ids, mask, positions(mask), DynamicCache(config=self.lm.config), steer)[1]


def embed_ids(ids: torch.Tensor, vocab_size: int, embed_words, steer: torch.Tensor) -> torch.Tensor:
    """Input embeddings for ids over vocab ∪ rows: ``embed_words(ids)`` below ``vocab_size``, row
    ``id - vocab_size`` of ``steer`` from there on.

    ``steer`` is the bank's (rows, d) input side, or (batch, rows, d): each batch row its own bank
    (the server, padded to the widest bank).  ``tokmem.vllm`` embeds its memory slots with it too.
    """
    memory = ids >= vocab_size
    words = embed_words(ids.masked_fill(memory, 0))
    if steer.shape[-2] == 0:
        return words
    slots = (ids - vocab_size).clamp(0, steer.shape[-2] - 1)
    if steer.dim() == 3:
        slots = slots + steer.shape[1] * torch.arange(len(ids), device=ids.device).unsqueeze(-1)
        steer = steer.flatten(0, 1)
    rows = steer[slots].to(words.dtype)
    return torch.where(memory.unsqueeze(-1), rows, words)


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids that skip left padding: 0 at each row's first real token."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def create(
    backbone: str | Backbone = DEFAULT_BACKBONE,
    decoupled: bool = False,
    shows_schemas: bool = False,
    memory_tokens: int = MEMORY_TOKENS,
    shared_tokens: int = SHARED_TOKENS,
    **load_options,
) -> TokMemModel:
    """A model with an empty bank tied to ``backbone`` (a spec or a loaded Backbone); ``decoupled``,
    ``shows_schemas``, ``memory_tokens``, ``shared_tokens``: the bank's form (``MemoryBank``)."""
    from tokmem.backbones import load_backbone

    if isinstance(backbone, str):
        backbone = load_backbone(backbone, **load_options)
    identity = {"name": backbone.name, "fingerprint": backbone.fingerprint()}
    bank = MemoryBank(backbone.hidden_size, decoupled, identity, shows_schemas, memory_tokens, shared_tokens)
    return TokMemModel(backbone, bank)


def load(bank_path, backbone: str | Backbone | None = None, **load_options) -> TokMemModel:
    """Load a bank and the backbone it was trained for (or the one given, which must match)."""
    from tokmem.backbones import load_backbone
    from tokmem.bank.file_format import read_backbone_name

    if backbone is None:
        backbone = read_backbone_name(bank_path)
    if isinstance(backbone, str):
        backbone = load_backbone(backbone, **load_options)
    return TokMemModel(backbone, MemoryBank.load(bank_path, backbone=backbone))


def compose(models: list[TokMemModel], names: list[str] | None = None) -> TokMemModel:
    """One model over several banks of one backbone: their rows one after another (``MemoryBank.merge``), so a turn
    may route to any of them (``tokmem.chat``, the server's ``model: "travel+billing"``).  ``names``: the banks'
    names, for errors.  Banks of other backbones, or sharing a procedure name, are a ``BankError`` naming them."""
    names = names or [f"bank {k}" for k in range(len(models))]
    first = models[0]
    form = first.bank
    bank = MemoryBank(form.hidden_size, form.decoupled, form.backbone, form.shows_schemas, form.memory_tokens)
    owner: dict[str, str] = {}
    for name, model in zip(names, models):
        if model.backbone is not first.backbone:
            raise BankError(f"cannot compose '{name}': it is loaded on another backbone than '{names[0]}'")
        clash = [procedure for procedure in model.bank.names if procedure in owner]
        if clash:
            raise BankError(
                f"cannot compose '{owner[clash[0]]}' and '{name}': both have {', '.join(map(repr, clash))} "
                "(procedure names must be unique across the banks)"
            )
        owner.update(dict.fromkeys(model.bank.names, name))
        bank.merge(model.bank)
    return TokMemModel(first.backbone, bank)
