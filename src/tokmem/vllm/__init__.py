"""Serve TokMem banks with vLLM: memory slots above the vocabulary, a per-worker bank registry, and a logits
processor that applies ``tokmem.decoding.decode``'s routing rules per request.  See docs/vllm.md.

This package imports vLLM only in ``model`` and ``processor`` (loaded by vLLM inside its workers)."""

from tokmem.vllm.client import cache_salt, engine_args, extra_args, procedures, prompt, sampling_params


def register() -> None:
    """The ``vllm.general_plugins`` entry point: make vLLM know the TokMem architectures."""
    from vllm import ModelRegistry

    from tokmem.vllm.client import ARCHITECTURES

    for name in ARCHITECTURES.values():
        if name not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(name, f"tokmem.vllm.model:{name}")


__all__ = ["cache_salt", "engine_args", "extra_args", "procedures", "prompt", "register", "sampling_params"]
