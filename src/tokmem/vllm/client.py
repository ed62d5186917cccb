"""What a program needs to send TokMem requests to vLLM: engine arguments, sampling parameters, prompts.

from vllm import LLM
from tokmem import vllm as tv

llm = LLM(model=MODEL_DIR, **tv.engine_args())
outputs = llm.generate([tv.prompt(tokenizer, "Reverse sun.", BANK)], tv.sampling_params(BANK, max_tokens=64))
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from tokmem.training.sequences import chat_prefix
from tokmem.vllm.slots import DEFAULT_SLOTS

PROCESSOR = "tokmem.vllm.processor:TokMemLogitsProcessor"
WORKER_EXTENSION = "tokmem.vllm.worker.TokMemWorker"  # vLLM resolves this one by dotted name
ARCHITECTURES = {"llama": "TokMemLlamaForCausalLM", "qwen2": "TokMemQwen2ForCausalLM"}


def engine_args(family: str = "llama", slots: int = DEFAULT_SLOTS) -> dict:
    """Keyword arguments for ``vllm.LLM`` / ``EngineArgs``: the TokMem architecture of the backbone's
    ``family`` (llama or qwen2) with ``slots`` memory slots, the logits processor, and the worker
    extension that reports where banks sit (``procedures``)."""
    if family not in ARCHITECTURES:
        raise ValueError(f"unknown model family {family!r}: choose from {', '.join(ARCHITECTURES)}")
    return {
        "hf_overrides": {"architectures": [ARCHITECTURES[family]], "tokmem_slots": slots},
        "logits_processors": [PROCESSOR],
        "worker_extension_cls": WORKER_EXTENSION,
    }


def extra_args(
    bank, threshold: float | None = None, max_steps: int | None = None, procedure: str | None = None
) -> dict:
    """``SamplingParams.extra_args`` (or ``vllm_xargs``) selecting ``bank`` and the routing options given."""
    values = {
        "tokmem_bank": str(bank),
        "tokmem_threshold": threshold,
        "tokmem_max_steps": max_steps,
        "tokmem_procedure": procedure,
    }
    return {key: value for key, value in values.items() if value is not None}


def sampling_params(bank, threshold=None, max_steps=None, procedure=None, **vllm_options):
    """``vllm.SamplingParams`` for a TokMem request (greedy unless ``temperature`` is given)."""
    from vllm import SamplingParams

    vllm_options.setdefault("temperature", 0.0)
    return SamplingParams(extra_args=extra_args(bank, threshold, max_steps, procedure), **vllm_options)


def prompt(tokenizer, query, bank) -> dict:
    """The query (text or chat messages) laid out as ``tokmem.generate`` lays it out, with the bank's
    ``cache_salt`` so that cached KV blocks are never shared across banks or bank revisions."""
    return {"prompt_token_ids": chat_prefix(tokenizer, query), "cache_salt": cache_salt(bank)}


def cache_salt(bank) -> str:
    """``path@revision``: the revision is a digest of the bank's tensors and metadata."""
    path = Path(bank)
    digest = hashlib.sha256(path.read_bytes())
    digest.update(path.with_name(path.name + ".json").read_bytes())
    return f"{path.resolve()}@{digest.hexdigest()[:16]}"


def procedures(token_ids: list[int], vocab: int, placement: dict) -> list[str]:
    """The procedures an answer's memory ids name, given its bank's ``placement`` in the worker (one value of
    ``llm.collective_rpc("tokmem_placements")[0]``, read while the bank is still placed)."""
    rows = [t - vocab - placement["offset"] for t in token_ids]
    return [placement["names"][row] for row in rows if 0 <= row < len(placement["names"])]  # context ids: no names
