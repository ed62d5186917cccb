"""The plugin's Qwen2 architecture: greedy answers equal ``tokmem.generate``'s on a tiny random Qwen2."""

import pytest
import torch
from conftest import assert_greedy_parity
from helpers import QUERIES, write_bank

from tokmem.backbones import byte_tokenizer, load_backbone

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
    assert_greedy_parity(qwen2_dir, backbone, paths, banks, QUERIES[:3], MAX_TOKENS, slots=8, family="qwen2")
