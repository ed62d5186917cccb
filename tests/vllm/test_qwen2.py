"""The plugin's Qwen2 architecture: greedy answers equal ``tokmem.generate``'s on a tiny random Qwen2."""

import pytest
import torch
from conftest import start_llm, stop_llm
from helpers import write_bank

import tokmem
from tokmem.backbones import byte_tokenizer, load_backbone
from tokmem.decode import DecodeConfig, to_generation
from tokmem.vllm import prompt, sampling_params

QUERIES = ["Reverse apple.", "hi", "What is the weather like today?"]
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    """A 2-layer Qwen2 (width 64, 2 heads of 32) with tiny-random's tokenizer, weight matrices scaled by 20."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = byte_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.ndim == 2:
                parameter.mul_(20)
    directory = tmp_path_factory.mktemp("qwen2")
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_greedy_answers_on_qwen2_equal_tokmem_generate(qwen2_dir, tmp_path):
    backbone = load_backbone(str(qwen2_dir), device="cpu")
    paths = {rows: tmp_path / f"bank{rows}.safetensors" for rows in (2, 3)}
    banks = {rows: write_bank(backbone, path, rows=rows, seed=rows) for rows, path in paths.items()}
    batch = [(rows, q, t) for rows in banks for q in QUERIES for t in (0.5, 0.0)]
    llm = start_llm(qwen2_dir, slots=8, family="qwen2")
    try:
        outputs = llm.generate(
            [prompt(backbone.tokenizer, q, paths[rows]) for rows, q, _ in batch],
            [sampling_params(paths[rows], threshold=t, max_tokens=MAX_TOKENS) for rows, _, t in batch],
            use_tqdm=False,
        )
        placements = llm.collective_rpc("tokmem_placements")[0]
    finally:
        stop_llm(llm)
    vocab, routed = backbone.vocab_size, 0
    for (rows, query, threshold), output in zip(batch, outputs):
        ids = list(output.outputs[0].token_ids)
        offset = placements[str(paths[rows].resolve())]["offset"]
        served = to_generation(
            banks[rows], query, [t - offset if t >= vocab else t for t in ids], 0.0, routed=ids[0] >= vocab
        )
        expected = tokmem.generate(banks[rows], [query], DecodeConfig(max_new_tokens=MAX_TOKENS, threshold=threshold))[
            0
        ]
        assert (served.routed, served.trace) == (expected.routed, expected.trace), (rows, query, threshold)
        routed += expected.routed
    assert routed > 0
