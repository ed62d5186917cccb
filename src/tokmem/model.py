"""TokMemModel: a frozen backbone plus a memory bank.

Memory token ids are ``vocab_size + row``.  The vocabulary is never resized and the embedding
matrix never unfrozen: memory ids are looked up in the bank, and the LM head's logits are
extended with ``h · Mᵀ``.  During training, the bank's trainable rows are the only parameters.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import DynamicCache

from tokmem import distributed
from tokmem.backbones import DEFAULT_BACKBONE, Backbone
from tokmem.bank import MemoryBank
from tokmem.errors import BankError
from tokmem.prefix_store import PrefixStore
from tokmem.sequences import ANSWER, IGNORE, positions


class TokMemModel(nn.Module):
    def __init__(self, backbone: Backbone, bank: MemoryBank):
        super().__init__()
        self.backbone = backbone
        self.bank = bank
        self.lm = backbone.model
        self.row_index: nn.Parameter | None = None
        self.row_steer: nn.Parameter | None = None
        self._rows: torch.Tensor | None = None

    @property
    def vocab_size(self) -> int:
        return self.backbone.vocab_size

    @property
    def device(self) -> torch.device:
        return self.backbone.device

    def memory_id(self, name: str) -> int:
        return self.vocab_size + self.bank.row(name)

    def is_memory(self, ids: torch.Tensor) -> torch.Tensor:
        return ids >= self.vocab_size

    # ---- trainable rows ---------------------------------------------------------------------------
    def unfreeze_rows(self) -> list[nn.Parameter]:
        """Make the bank's trainable rows the model's only parameters; returns them for the optimiser."""
        self._rows = self.bank.trainable_rows().to(self.device)
        self.row_index = nn.Parameter(self.bank.index[self._rows.cpu()].to(self.device))
        if self.bank.decoupled:
            self.row_steer = nn.Parameter(self.bank.steer[self._rows.cpu()].to(self.device))
        return [p for p in (self.row_index, self.row_steer) if p is not None]

    def write_rows(self) -> None:
        """Copy the live trainable rows into the bank (e.g. for a checkpoint); training goes on."""
        rows = self._rows.cpu()
        self.bank.index[rows] = self.row_index.detach().float().cpu()
        if self.row_steer is not None:
            self.bank.steer[rows] = self.row_steer.detach().float().cpu()

    def commit_rows(self) -> None:
        """Write the trained rows back into the bank and drop the parameters."""
        self.write_rows()
        self.row_index = self.row_steer = self._rows = None

    @torch.no_grad()
    def renormalize_live_rows(self, target: float, eps: float = 1e-8) -> None:
        """Rescale the live trainable index rows to L2 norm ``target`` (the bank's ``renormalize``, mid-training)."""
        self.row_index.mul_(target / (self.row_index.norm(dim=1, keepdim=True) + eps))

    def memory_matrices(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(index, steer) over all rows on the model's device, with trainable rows as live parameters."""
        index = self._with_rows(self.bank.index, self.row_index)
        steer = self._with_rows(self.bank.steer, self.row_steer) if self.bank.decoupled else index
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

    def loss(
        self, batch: dict, prefixes: PrefixStore | None = None, segments: bool = False
    ) -> tuple[torch.Tensor, int]:
        """Mean next-token loss over labelled positions only (memory, response and EOS tokens).

        Vocabulary logits are computed only at positions that have a label.  With a frozen backbone the
        query prefix does not depend on the bank (the first memory token comes after it), so it runs
        without gradients (once a run with ``prefixes``) and only the labelled suffix is back-propagated
        (see ``_suffix_hidden``); with ``segments``, only each labelled segment on its own (an approximation, see
        ``_segment_hidden``).
        """
        index, steer = self.memory_matrices()
        labels = batch["labels"]
        starts = (labels != IGNORE).int().argmax(-1)
        if self._prefix_is_fixed(batch["input_ids"], starts):
            suffix_hidden = self._segment_hidden if segments else self._suffix_hidden
            hidden, labels = suffix_hidden(batch, starts, steer, prefixes)
        else:
            hidden, _ = self.hidden(batch["input_ids"], batch["attention_mask"], steer=steer)
            hidden, labels = hidden[:, :-1], labels[:, 1:]
        where = labels != IGNORE
        logits = self.logits(hidden[where], index)
        return next_token_loss(logits.float(), labels[where], self.vocab_size), int(where.sum())

    @property
    def layers_sharded(self) -> bool:
        """Whether the backbone's layers are sharded across processes (``distributed.shard_layers``): every rank
        must then run the same passes through them."""
        return distributed.layers_sharded(self.lm)

    def _prefix_is_fixed(self, ids: torch.Tensor, starts: torch.Tensor) -> bool:
        """Whether nothing before the first label trains: no backbone weight (LoRA) and no memory token
        (prefix tuning puts its rows there)."""
        if any(p.requires_grad for p in self.lm.parameters()):
            return False
        in_prefix = torch.arange(ids.shape[1], device=ids.device) < starts.unsqueeze(-1)
        memory_in_prefix = (self.is_memory(ids) & in_prefix).any()
        fixed = ~memory_in_prefix & (starts.min() > 0)
        return distributed.all_ranks(fixed) if self.layers_sharded else bool(fixed)  # one host sync

    def _suffix_hidden(self, batch: dict, starts: torch.Tensor, steer: torch.Tensor, prefixes: PrefixStore | None):
        """Hidden states that predict each suffix token, and the suffix labels (right-padded).

        The query prefixes come as a KV cache computed without gradients (``_encode_prefixes``, or kept in
        ``prefixes`` from an earlier epoch); the suffixes (from the first labelled token on) run on top of it with
        gradients.  The state predicting the first suffix token is the prefix's last one.
        """
        hidden, labels, _ = self._suffix_pass(batch, starts, steer, prefixes, packable=True)
        return hidden, labels

    def _packed_suffix(self, suffix, real, starts, cache, mask, steer) -> torch.Tensor:
        """The suffixes' hidden states (right-padded as ``suffix``), computed in one row without their padding: the
        real suffix tokens side by side, each attending to its own row's prefix states (``cache``'s real columns,
        packed the same way) and to its own suffix up to itself (a block mask), at its own positions.  The same
        states as the padded pass (the padding was masked there), for the positions a batch really has: on SNI
        sequences half of a padded batch's suffix positions are padding."""
        rows = torch.arange(len(suffix), device=suffix.device)
        query_row, key_row = rows.unsqueeze(-1).expand_as(suffix)[real], rows.unsqueeze(-1).expand_as(mask)[mask.bool()]
        query_column = torch.arange(suffix.shape[1], device=suffix.device).expand_as(suffix)[real]
        packed = DynamicCache(config=self.lm.config)
        for layer, states in enumerate(cache.layers):  # (batch, heads, keys, d) -> (1, heads, real keys, d)
            keys, values = (
                t.transpose(1, 2)[mask.bool()].transpose(0, 1).unsqueeze(0) for t in (states.keys, states.values)
            )
            packed.update(keys, values, layer)
        same_row = query_row.unsqueeze(-1) == query_row
        allowed = torch.cat(
            [query_row.unsqueeze(-1) == key_row, same_row & (query_column <= query_column.unsqueeze(-1))], dim=-1
        )
        position_ids = (starts[query_row] + query_column).unsqueeze(0)
        hidden, _ = self.hidden(
            suffix[real].unsqueeze(0), self._attention_mask(allowed.unsqueeze(0)), position_ids, packed, steer
        )
        return hidden.new_zeros(*suffix.shape, hidden.shape[-1]).masked_scatter(real.unsqueeze(-1), hidden[0])

    def _prefix_states(self, batch: dict, starts: torch.Tensor, steer: torch.Tensor, prefixes: PrefixStore | None):
        """(KV cache, attention mask, hidden states) of the rows' query prefixes, left-padded: encoded now
        (``_encode_prefixes``), or kept in ``prefixes`` from an earlier epoch (without gradients: call under
        ``torch.no_grad``)."""
        if prefixes is None:
            return self._encode_prefixes(batch, starts, steer.detach())

        def encode(rows: list[int]):
            return self._encode_prefixes(_rows(batch, rows), starts[rows], steer.detach())

        return prefixes.states(batch["input_ids"], starts, encode, self.lm.config)

    def _suffix_pass(
        self, batch: dict, starts: torch.Tensor, steer: torch.Tensor, prefixes: PrefixStore | None, packable=False
    ):
        """``_suffix_hidden``'s states and labels, and what a later pass over the suffix attends to: (the suffix ids,
        the KV cache of prefix and suffix, its attention mask: the prefix left-padded, the suffix right-padded).
        ``packable``: the suffixes run packed where that pays (``_packing_pays``), and then nothing is attended to
        later (None)."""
        with torch.no_grad():
            cache, mask, routing = self._prefix_states(batch, starts, steer, prefixes)
        suffix, suffix_mask, labels = _split_suffix(batch, starts)
        real = suffix_mask.bool()
        if packable and len(suffix) > 1 and _packing_pays(real, mask, self.lm.config.hidden_size):
            hidden, attended = self._packed_suffix(suffix, real, starts, cache, mask, steer), None
        else:
            position_ids = starts.unsqueeze(-1) + positions(suffix_mask)
            mask = torch.cat([mask, suffix_mask], dim=-1)
            hidden, cache = self.hidden(suffix, mask, position_ids, cache, steer)
            attended = suffix, cache, mask
        return torch.cat([routing[:, -1:], hidden[:, :-1]], dim=1), labels, attended

    def _segment_hidden(self, batch: dict, starts: torch.Tensor, steer: torch.Tensor, prefixes: PrefixStore | None):
        """``_suffix_hidden``'s states and labels, back-propagating each labelled segment on its own
        (``TrainConfig.segment_backprop``): the whole record once without gradients, then every segment (a run of
        labels: a memory token, its arguments and the EOS ending the turn; an answer) with gradients, attending to
        the detached states before it.  What the loss does not need (tool results, the turns around them) is never
        back-propagated, and a memory row's input side learns from its own segment's loss only; with one segment a
        record this is exact.  All segments of a batch run in one pass: each row's segments packed side by side, kept
        apart by the attention mask (``_segment_packing``).  A batch of one segment a record takes ``_suffix_hidden``:
        exact there, and cheaper."""
        runs, inside = _segment_starts(batch["labels"]), _inside_segments(batch["labels"])
        most, width = torch.stack([runs.sum(-1).max(), inside.sum(-1).max()]).tolist()  # one host sync
        if self.layers_sharded:  # every rank runs the same passes
            most, width = (distributed.global_max(count, self.device) for count in (most, width))
        if most <= 1:
            return self._suffix_hidden(batch, starts, steer, prefixes)
        with torch.no_grad():
            context, labels, (suffix, cache, mask) = self._suffix_pass(batch, starts, steer.detach(), prefixes)
        if width == 0:  # every segment is one label, predicted by the state before it: the context's
            return context, labels
        inside = _inside_segments(labels)
        columns, allowed = _segment_packing(labels, inside, mask, width)
        position_ids = starts.unsqueeze(-1) + columns
        hidden, _ = self.hidden(suffix.gather(1, columns), self._attention_mask(allowed), position_ids, cache, steer)
        return _with_segments(context, hidden, inside), labels

    def _attention_mask(self, allowed: torch.Tensor) -> torch.Tensor:
        """A (batch, 1, queries, keys) mask of where each query may attend, as the backbone's attention takes it:
        boolean for SDPA, additive (0 or the dtype's minimum) for the eager implementation."""
        if self.lm.config._attn_implementation == "sdpa":
            return allowed.unsqueeze(1)
        dtype = self.lm.dtype
        additive = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
        return additive.masked_fill(~allowed, torch.finfo(dtype).min).unsqueeze(1)

    def _encode_prefixes(self, batch: dict, starts: torch.Tensor, steer: torch.Tensor):
        """(KV cache, attention mask, hidden states) of the rows' query prefixes, left-padded: first the ids every
        row starts with (the chat template's system prompt, typically) once for the whole batch, then each row's
        rest of the prefix."""
        shared = _shared_width(batch["input_ids"], starts)
        if self.layers_sharded:  # every rank runs the shared pass, or none does
            shared = shared * distributed.all_ranks(shared > 0)
        shared, prefix, prefix_mask = _split_prefix(batch, starts, shared)
        rows, width = len(prefix), shared.shape[1]
        cache = self.prefix_cache(shared, steer) if width else DynamicCache(config=self.lm.config)
        cache.batch_repeat_interleave(rows)
        mask = torch.cat([prefix_mask.new_ones(rows, width), prefix_mask], dim=-1)
        hidden, cache = self.hidden(prefix, mask, width + positions(prefix_mask), cache, steer)
        return cache, mask, hidden


def next_token_loss(logits: torch.Tensor, labels: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Mean cross-entropy of ``labels`` under ``logits`` (over vocab ∪ bank); at an ``ANSWER`` label the target is
    every vocabulary token together, -log P(vocabulary): the answer in words, not which words."""
    answer = labels == ANSWER
    if not answer.any():
        return nn.functional.cross_entropy(logits, labels)
    target = logits.gather(1, labels.clamp(min=0).unsqueeze(1)).squeeze(1)
    target = target.masked_scatter(answer, logits[answer, :vocab_size].logsumexp(-1))
    return (logits.logsumexp(-1) - target).mean()


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


def create(backbone: str | Backbone = DEFAULT_BACKBONE, decoupled: bool = False, **load_options) -> TokMemModel:
    """A model with an empty bank tied to ``backbone`` (a spec or a loaded Backbone)."""
    from tokmem.backbones import load_backbone

    if isinstance(backbone, str):
        backbone = load_backbone(backbone, **load_options)
    identity = {"name": backbone.name, "fingerprint": backbone.fingerprint()}
    return TokMemModel(backbone, MemoryBank(backbone.hidden_size, decoupled=decoupled, backbone=identity))


def load(bank_path, backbone: str | Backbone | None = None, **load_options) -> TokMemModel:
    """Load a bank and the backbone it was trained for (or the one given, which must match)."""
    from tokmem.backbones import load_backbone
    from tokmem.bank_format import read_backbone_name

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
    bank = MemoryBank(first.bank.hidden_size, first.bank.decoupled, first.bank.backbone)
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


def _shared_width(ids: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """How many ids every row starts with, short of each row's last prefix id (whose state routes)."""
    common = (ids == ids[:1]).all(0).long().cumprod(0).sum()
    return torch.minimum(common, starts.min() - 1)


def _split_prefix(batch: dict, starts: torch.Tensor, shared: torch.Tensor):
    """(shared ids) (1, ``shared``) and (prefix ids, prefix mask) left-padded: the rest up to each row's first label.

    Gathers, not a loop over rows: one host sync (the two widths) whatever the batch size.
    """
    ids = batch["input_ids"]
    shared_width, prefix_width = torch.stack([shared, starts.max() - shared]).tolist()
    prefix_columns = torch.arange(prefix_width, device=ids.device) + (starts - prefix_width).unsqueeze(-1)
    prefix_mask = (prefix_columns >= shared_width).long()
    prefix = ids.gather(1, prefix_columns.clamp(min=0)) * prefix_mask
    return ids[:1, :shared_width], prefix, prefix_mask


def _packing_pays(real: torch.Tensor, prefix_mask: torch.Tensor, width: int) -> bool:
    """Whether packing the suffixes (``real``: their tokens, right-padded) into one row costs fewer FLOPs than the
    padded batch: it saves the padding positions (~12·d² a layer each: projections and MLP) but its one block-masked
    attention spans every row's keys (~4·d a layer per query-key pair).  Short uneven suffixes on long prefixes (SNI
    answers) pack; long ones with little padding (tool loops' results) do not.  One host sync."""
    rows, suffix_width = real.shape
    tokens, keys = torch.stack([real.sum(), prefix_mask.sum()]).tolist()
    padded_pairs = rows * suffix_width * (prefix_mask.shape[1] + suffix_width)
    saved_positions = rows * suffix_width - tokens
    return saved_positions * 3 * width > tokens * (keys + tokens) - padded_pairs


def _split_suffix(batch: dict, starts: torch.Tensor):
    """(suffix ids, suffix mask, suffix labels) right-padded: each row from its first label on (one host sync)."""
    ids, labels = batch["input_ids"], batch["labels"]
    lengths = batch["attention_mask"].sum(-1)
    suffix_width = int((lengths - starts).max())
    suffix_columns = torch.arange(suffix_width, device=ids.device) + starts.unsqueeze(-1)
    suffix_mask = (suffix_columns < lengths.unsqueeze(-1)).long()
    suffix_columns = suffix_columns.clamp(max=ids.shape[1] - 1)
    suffix = ids.gather(1, suffix_columns) * suffix_mask
    suffix_labels = labels.gather(1, suffix_columns).masked_fill(suffix_mask == 0, IGNORE)
    return suffix, suffix_mask, suffix_labels


def _inside_segments(labels: torch.Tensor) -> torch.Tensor:
    """Which suffix columns' states predict a label of their own segment (a run of labels): the column and the next
    one both labelled.  A segment's first label is predicted by the state before the segment, the context's."""
    labelled = labels != IGNORE
    return labelled & nn.functional.pad(labelled[:, 1:], (0, 1))


def _segment_starts(labels: torch.Tensor) -> torch.Tensor:
    """Where each segment (run of labels) starts."""
    labelled = labels != IGNORE
    return labelled & ~nn.functional.pad(labelled[:, :-1], (1, 0))


def _segment_packing(labels: torch.Tensor, inside: torch.Tensor, mask: torch.Tensor, width: int):
    """(columns, allowed): the suffix columns ``inside`` their segments packed to the left of each row (right-padded
    to ``width``), and where each may attend, (batch, width, keys): the cache's real columns (``mask``: the prefix's,
    then the suffix's) before its segment starts, then its own segment's packed columns up to itself.  A padding
    column attends to itself only (a query that attends to nothing would give NaN)."""
    suffix_width = labels.shape[1]
    column = torch.arange(suffix_width, device=labels.device)
    segment_start = torch.where(_segment_starts(labels), column, 0).cummax(-1).values
    columns = torch.where(inside, column, suffix_width + column).argsort(-1)[:, :width]
    segment = segment_start.gather(1, columns).unsqueeze(-1)  # (batch, width, 1)
    keys = torch.arange(mask.shape[1], device=mask.device) - (mask.shape[1] - suffix_width)  # in suffix columns
    before = mask.bool().unsqueeze(1) & (keys < segment)
    real = torch.arange(width, device=labels.device) < inside.sum(-1, keepdim=True)
    own = (segment == segment.transpose(1, 2)) & (columns.unsqueeze(1) <= columns.unsqueeze(-1)) & real.unsqueeze(1)
    return columns, torch.cat([before, own | torch.eye(width, dtype=torch.bool, device=own.device)], dim=-1)


def _with_segments(context: torch.Tensor, hidden: torch.Tensor, inside: torch.Tensor) -> torch.Tensor:
    """The states predicting each suffix column: the segments' pass's (``hidden``, packed) where the column before
    is ``inside`` a segment, else the context's."""
    from_segment = nn.functional.pad(inside[:, :-1], (1, 0))
    slots = nn.functional.pad(inside.cumsum(-1)[:, :-1] - 1, (1, 0)).clamp(min=0)
    packed = hidden.gather(1, slots.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
    return torch.where(from_segment.unsqueeze(-1), packed.to(context.dtype), context)


def _rows(batch: dict, rows: list[int]) -> dict:
    """The batch's rows ``rows``."""
    index = torch.tensor(rows, device=batch["input_ids"].device)
    return {name: tensor[index] for name, tensor in batch.items()}
