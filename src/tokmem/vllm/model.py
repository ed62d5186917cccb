"""vLLM's own Llama and Qwen2 models with S memory slots above the vocabulary.

The bank enters the network in the same two places as in ``tokmem.model``: ids >= vocab are embedded
from the slot table's steer rows (``embed_ids``), and the logits get ``hidden @ indexᵀ`` appended for
the S slots (``TokMemModel.memory_logits``).  Both are branch-free over fixed-shape tables, so a
memory id sampled at one step is simply embedded at the next (chaining) and compiled or graph-captured
forwards stay valid.  Which slots a request may use is the logits processor's business.

The number of slots comes from the model config's ``tokmem_slots`` (``hf_overrides``; default
``slots.DEFAULT_SLOTS``); the architecture is chosen the same way (``tokmem.vllm.engine_args``).
"""

from __future__ import annotations

import torch
from vllm.model_executor.models.llama import LlamaForCausalLM
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM

from tokmem.model import TokMemModel, embed_ids
from tokmem.vllm import slots


class MemorySlots:
    """Mixin for a vLLM ``*ForCausalLM``: call ``_add_slots`` at the end of ``__init__``."""

    def _add_slots(self, vllm_config) -> None:
        config = vllm_config.model_config.hf_config
        self.vocab = config.vocab_size
        self.slot_table = slots.install(
            slots.SlotTable(
                getattr(config, "tokmem_slots", slots.DEFAULT_SLOTS),
                config.hidden_size,
                self.vocab,
                dtype=vllm_config.model_config.dtype,
                device=next(self.parameters()).device,
            )
        )
        embed_words = self.model.embed_input_ids  # the backbone's own lookup, for ids below the vocabulary
        self.model.embed_input_ids = lambda ids: embed_ids(ids, self.vocab, embed_words, self.slot_table.steer)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        logits = super().compute_logits(hidden_states)
        if logits is None:  # tensor-parallel ranks other than the first
            return None
        return torch.cat([logits, TokMemModel.memory_logits(hidden_states, self.slot_table.index)], dim=-1)


class TokMemLlamaForCausalLM(MemorySlots, LlamaForCausalLM):
    def __init__(self, *, vllm_config, prefix: str = "", **kwargs):
        super().__init__(vllm_config=vllm_config, prefix=prefix, **kwargs)
        self._add_slots(vllm_config)


class TokMemQwen2ForCausalLM(MemorySlots, Qwen2ForCausalLM):
    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self._add_slots(vllm_config)
