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


def assert_greedy_parity(model_dir, backbone, paths: dict, banks: dict, queries, max_tokens: int, **engine) -> None:
    """Serve ``queries`` against every bank at thresholds 0.5 and 0 in one batch; each greedy answer must equal
    ``tokmem.generate``'s (routing and trace), and some answers must route (so the banks' rows mattered)."""
    import tokmem
    from tokmem.decoding.decode import DecodeConfig, to_generation
    from tokmem.vllm import prompt, sampling_params

    batch = [(key, q, t) for key in banks for q in queries for t in (0.5, 0.0)]
    llm = start_llm(model_dir, **engine)
    try:
        outputs = llm.generate(
            [prompt(backbone.tokenizer, q, paths[key]) for key, q, _ in batch],
            [sampling_params(paths[key], threshold=t, max_tokens=max_tokens) for key, _, t in batch],
            use_tqdm=False,
        )
        placements = llm.collective_rpc("tokmem_placements")[0]
    finally:
        stop_llm(llm)
    vocab, routed = backbone.vocab_size, 0
    for (key, query, threshold), output in zip(batch, outputs):
        ids = list(output.outputs[0].token_ids)
        offset = placements[str(paths[key].resolve())]["offset"]
        served = to_generation(
            banks[key], query, [t - offset if t >= vocab else t for t in ids], 0.0, routed=ids[0] >= vocab
        )
        config = DecodeConfig(max_new_tokens=max_tokens, threshold=threshold)
        expected = tokmem.generate(banks[key], [query], config)[0]
        assert (served.routed, served.trace) == (expected.routed, expected.trace), (key, query, threshold)
        routed += expected.routed
    assert routed > 0
