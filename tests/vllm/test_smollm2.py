"""The vLLM plugin on the real smollm2-135m backbone: greedy answers equal ``tokmem.generate``'s."""

import pytest
from conftest import assert_greedy_parity
from helpers import write_bank

import tokmem
from tokmem.backbones import cache_dir

QUERIES = ["Reverse the word apple.", "What is the capital of France?", "Write a haiku about rain.", "hi"]
MAX_TOKENS = 24

pytestmark = pytest.mark.slow


def test_greedy_answers_on_smollm2_across_banks_equal_tokmem_generate(tmp_path):
    backbone = tokmem.load_backbone("smollm2-135m", device="cpu")
    model_dir = cache_dir() / "backbones" / "smollm2-135m-instruct-q4_1"  # the converted model load_backbone made
    banks = {rows: write_bank(backbone, tmp_path / f"bank{rows}.safetensors", rows=rows, seed=rows) for rows in (2, 5)}
    paths = {rows: tmp_path / f"bank{rows}.safetensors" for rows in banks}
    assert_greedy_parity(model_dir, backbone, paths, banks, QUERIES, MAX_TOKENS, slots=32)
