"""Banks whose memory tokens are followed by context ids (a tool's tail, the shared rows) on vLLM: greedy answers equal
``tokmem.generate``'s, beside a plain bank in the same batch."""

from conftest import assert_greedy_parity
from helpers import QUERIES, random_rows, write_bank

import tokmem

FORMS = {"tails": {"memory_tokens": 3}, "shared": {"memory_tokens": 2, "shared_tokens": 1}}


def tool_bank(backbone, path, seed: int, **form):
    """Three tools (no schemas: the plugin decodes arguments unconstrained) with random rows, saved at ``path``."""
    model = tokmem.create(backbone, **form)
    model.bank.add(["t0", "t1", "t2"], backbone.mean_embedding(), kinds=["tool"] * 3)
    random_rows(model.bank, seed=seed)
    model.bank.save(path)
    return model


def test_greedy_answers_of_banks_with_tails_and_shared_rows_equal_tokmem_generate(
    vllm_backbone, vllm_model_dir, tmp_path
):
    paths = {name: tmp_path / f"{name}.safetensors" for name in [*FORMS, "plain"]}
    banks = {
        name: tool_bank(vllm_backbone, paths[name], seed, **form) for seed, (name, form) in enumerate(FORMS.items())
    }
    banks["plain"] = write_bank(vllm_backbone, paths["plain"], rows=3, seed=5)
    assert_greedy_parity(vllm_model_dir, vllm_backbone, paths, banks, QUERIES[:3], max_tokens=24, slots=32)
