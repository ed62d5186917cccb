"""vLLM plugin tests: they run in the vLLM environment (``make vllm-env``, ``.venv-vllm``); without vLLM
installed (the main environment) nothing here is collected."""

import gc
import importlib.util
import os

import pytest
import torch


def _vllm_installed() -> bool:
    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin is not None  # not this directory, seen as a namespace package


collect_ignore_glob = [] if _vllm_installed() else ["test_*.py"]

os.environ.setdefault(
    "VLLM_CPU_KVCACHE_SPACE", "1"
)  # GiB of KV cache on the CPU (vLLM's default, 4, is more than the tests need)


@pytest.fixture(scope="session")
def vllm_backbone():
    """tiny-random-head32 (vLLM's CPU attention supports no head dimension below 32) with, like
    ``lively_backbone``, every weight matrix scaled by 20 so that greedy output depends on the context."""
    from tokmem.backbones import Backbone, load_backbone

    backbone = load_backbone("tiny-random-head32", device="cpu")
    with torch.no_grad():
        for parameter in backbone.model.parameters():
            if parameter.ndim == 2:
                parameter.mul_(20)
    return Backbone("tiny-random-head32-x20", backbone.model, backbone.tokenizer)


@pytest.fixture(scope="session")
def vllm_model_dir(vllm_backbone, tmp_path_factory):
    """The backbone saved as a Hugging Face model directory, for vLLM to load."""
    directory = tmp_path_factory.mktemp("vllm-model")
    vllm_backbone.model.save_pretrained(directory)
    vllm_backbone.tokenizer.save_pretrained(directory)
    return directory


def start_llm(model_dir, slots: int, family: str = "llama"):
    """A vLLM engine with the TokMem plugin on the CPU (float32, eager), greedy decoding reproducible."""
    from vllm import LLM

    from tokmem.vllm import engine_args

    return LLM(
        model=str(model_dir),
        dtype="float32",
        enforce_eager=True,
        seed=0,
        max_model_len=512,
        **engine_args(family, slots),
    )


def stop_llm(llm) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
