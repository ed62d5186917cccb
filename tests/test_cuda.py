"""The GPU path on tiny-random: bf16 backbone with float32 rows, and answers that match the CPU's.

Skipped where torch sees no CUDA device (CI has none); run with ``pytest -m cuda`` on a GPU machine.
"""

import copy

import pytest
import torch
from helpers import QUERIES, SERVED_BANKS, write_served_banks

import tokmem
from tokmem import DecodeConfig, TrainConfig
from tokmem.backbones import Backbone, load_backbone
from tokmem.training.sequences import chat_prefix
from tokmem.serve.banks import BankRegistry
from tokmem.serve.engine import Engine, Request

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def on_gpu(backbone: Backbone, dtype: torch.dtype) -> Backbone:
    return Backbone(backbone.name, copy.deepcopy(backbone.model).to("cuda", dtype), backbone.tokenizer)


def test_a_gpu_backbone_loads_in_bf16_by_default():
    backbone = load_backbone("tiny-random", device="cuda")
    assert backbone.model.dtype == torch.bfloat16 and backbone.device.type == "cuda"
    assert not any(p.requires_grad for p in backbone.model.parameters())


def test_bf16_training_trains_float32_rows_and_leaves_the_backbone_bit_identical(lively_backbone, examples):
    backbone = on_gpu(lively_backbone, torch.bfloat16)
    before = {name: tensor.clone() for name, tensor in backbone.model.state_dict().items()}
    model = tokmem.create(backbone)
    losses = tokmem.learn(model, examples, TrainConfig(epochs=60, batch_size=3, lr=2e-2, progress=False)).losses
    assert model.bank.index.dtype == torch.float32 and model.bank.index.isfinite().all()
    assert sum(losses[-10:]) < 0.8 * sum(losses[:10])
    assert all(torch.equal(before[name], tensor) for name, tensor in backbone.model.state_dict().items())


def test_a_bank_trained_on_the_gpu_in_bf16_loads_on_the_cpu(lively_backbone, examples, tmp_path):
    model = tokmem.create(on_gpu(lively_backbone, torch.bfloat16))
    tokmem.learn(model, examples, TrainConfig(epochs=2, progress=False))
    model.bank.save(tmp_path / "bank.safetensors")
    on_cpu = tokmem.load(tmp_path / "bank.safetensors", backbone=lively_backbone)
    assert torch.equal(on_cpu.bank.index, model.bank.index)


def test_float32_answers_on_the_gpu_equal_the_cpu_answers(lively_backbone, examples):
    cpu = tokmem.create(lively_backbone)
    tokmem.learn(cpu, examples, TrainConfig(epochs=2, progress=False))
    gpu = tokmem.TokMemModel(on_gpu(lively_backbone, torch.float32), copy.deepcopy(cpu.bank))
    config = DecodeConfig(max_new_tokens=12, threshold=0.0, max_steps=3)
    expected = tokmem.generate(cpu, QUERIES[:4], config)
    answers = tokmem.generate(gpu, QUERIES[:4], config)
    assert [[(s.procedure, s.text) for s in a.trace] for a in answers] == [
        [(s.procedure, s.text) for s in e.trace] for e in expected
    ]
    assert len({a.text for a in answers}) > 1  # the answers depend on the query: the comparison is not trivial


def test_the_serving_engine_on_the_gpu_answers_as_generate_with_banks_mixed_in_one_batch(lively_backbone, tmp_path):
    backbone = on_gpu(lively_backbone, torch.float32)
    offline = write_served_banks(backbone, tmp_path)
    registry = BankRegistry(backbone, tmp_path)
    engine = Engine(backbone, max_batch=8)
    jobs = [(bank, query) for bank in SERVED_BANKS for query in QUERIES[:2]]
    handles = [
        engine.submit(
            Request(registry.get(bank), chat_prefix(backbone.tokenizer, query), query, max_tokens=10, threshold=0.0)
        )
        for bank, query in jobs
    ]
    while engine.step():
        pass
    for (bank, query), handle in zip(jobs, handles):
        expected = tokmem.generate(offline[bank], [query], DecodeConfig(max_new_tokens=10, threshold=0.0))[0]
        assert handle.generation().text == expected.text, (bank, query)
