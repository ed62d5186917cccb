"""The vLLM plugin on the real smollm2-135m backbone: greedy answers equal ``tokmem.generate``'s."""

import pytest
from conftest import start_llm, stop_llm
from helpers import write_bank

import tokmem
from tokmem.backbones import cache_dir
from tokmem.decode import DecodeConfig, to_generation
from tokmem.vllm import prompt, sampling_params

QUERIES = ["Reverse the word apple.", "What is the capital of France?", "Write a haiku about rain.", "hi"]
MAX_TOKENS = 24

pytestmark = pytest.mark.slow


def test_greedy_answers_on_smollm2_across_banks_equal_tokmem_generate(tmp_path):
    backbone = tokmem.load_backbone("smollm2-135m", device="cpu")
    model_dir = cache_dir() / "backbones" / "smollm2-135m-instruct-q4_1"  # the converted model load_backbone made
    banks = {rows: write_bank(backbone, tmp_path / f"bank{rows}.safetensors", rows=rows, seed=rows) for rows in (2, 5)}
    batch = [(rows, q, t) for rows in banks for q in QUERIES for t in (0.5, 0.0)]
    llm = start_llm(model_dir, slots=32)
    try:
        outputs = llm.generate(
            [prompt(backbone.tokenizer, q, tmp_path / f"bank{rows}.safetensors") for rows, q, _ in batch],
            [
                sampling_params(tmp_path / f"bank{rows}.safetensors", threshold=t, max_tokens=MAX_TOKENS)
                for rows, _, t in batch
            ],
            use_tqdm=False,
        )
        placements = llm.collective_rpc("tokmem_placements")[0]
    finally:
        stop_llm(llm)
    vocab, routed = backbone.vocab_size, 0
    for (rows, query, threshold), output in zip(batch, outputs):
        ids = list(output.outputs[0].token_ids)
        offset = placements[str((tmp_path / f"bank{rows}.safetensors").resolve())]["offset"]
        served = to_generation(
            banks[rows], query, [t - offset if t >= vocab else t for t in ids], 0.0, routed=ids[0] >= vocab
        )
        expected = tokmem.generate(banks[rows], [query], DecodeConfig(max_new_tokens=MAX_TOKENS, threshold=threshold))[
            0
        ]
        assert (served.routed, served.trace) == (expected.routed, expected.trace), (rows, query, threshold)
        routed += expected.routed
    assert 0 < routed  # memory tokens were chosen, so the banks' rows mattered
