"""Data-parallel training: N processes at batch b learn what one process learns at batch N·b.

The processes are started by torchrun itself (``python -m torch.distributed.run``), on the CPU with
gloo, exactly as the README tells a user to run ``tokmem train``.
"""

import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tokmem.backbones import load_backbone
from tokmem.bank.memory_bank import MemoryBank
from tokmem.cli import main
import tokmem
from tokmem.data import Example, Step, load_examples, save_examples
from tokmem.errors import TokMemError
from tokmem.training.train import TrainConfig, fit
from tokmem.training.distributed import shard

WORDS = ["apple", "house", "table", "chair", "green", "water", "river", "stone", "cloud"]


@pytest.fixture
def data(tmp_path):
    examples = [Example(f"Reverse {w}.", (Step("reverse", w[::-1]),)) for w in WORDS]
    examples += [Example(f"Upper {w}.", (Step("upper", w.upper()),)) for w in WORDS]
    save_examples(examples, tmp_path / "train.jsonl")
    return tmp_path / "train.jsonl"


def train_options(data, out, batch_size: int) -> list[str]:
    return [
        "train",
        "--data",
        str(data),
        "--out",
        str(out),
        "--backbone",
        "tiny-random",
        "--device",
        "cpu",
        "--epochs",
        "2",
        "--batch-size",
        str(batch_size),
        "--lr",
        "0.05",
        "--quiet",
    ]


def under_torchrun(options: list[str]) -> None:
    launch = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "tokmem.cli",
    ]
    finished = subprocess.run(
        launch + options, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300
    )
    assert finished.returncode == 0, finished.stderr[-3000:]


def test_shards_of_a_step_cover_it_once_in_order():
    items = list(range(7))
    shares = [shard(items, rank, 3) for rank in range(3)]
    assert shares == [[0, 1, 2], [3, 4], [5, 6]]
    assert shard(items[:1], 1, 2) == []  # a rank may get nothing on a short last step, and still take part


def test_two_torchrun_processes_at_batch_2_train_the_bank_one_process_trains_at_batch_4(data, tmp_path):
    single, double = tmp_path / "single.safetensors", tmp_path / "double.safetensors"
    assert main(train_options(data, single, 4)) == 0
    under_torchrun(train_options(data, double, 2))
    one, two = MemoryBank.load(single), MemoryBank.load(double)
    assert one.names == two.names == ["reverse", "upper"]
    assert not torch.allclose(one.index[0], one.index[1])  # both rows started as the mean embedding: they trained
    assert torch.allclose(one.index, two.index, rtol=1e-4, atol=1e-5)


def test_backbone_layers_sharded_over_two_processes_train_the_bank_one_process_trains(data, tmp_path):
    """FSDP2: uneven shares (17 examples: the last step's one example leaves the second rank a filler pass) and
    accumulation (two micro-batches a step) still give one process's bank."""
    examples = load_examples(data)[:17]
    save_examples(examples, data)
    single, sharded = tmp_path / "single.safetensors", tmp_path / "sharded.safetensors"
    assert main([*train_options(data, single, 2), "--grad-accum", "2"]) == 0
    under_torchrun([*train_options(data, sharded, 1), "--grad-accum", "2", "--fsdp"])
    one, two = MemoryBank.load(single), MemoryBank.load(sharded)
    assert not torch.allclose(one.index[0], one.index[1])
    assert torch.allclose(one.index, two.index, rtol=1e-4, atol=1e-5)


def test_sharding_refuses_weights_that_train_inside_the_backbone(tmp_path):
    model = tokmem.create("tiny-random", device="cpu")
    model.bank.add(["a"], model.backbone.mean_embedding())
    weight = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(TokMemError, match="fsdp shards a frozen backbone"):
        fit(model, [], TrainConfig(fsdp=True, progress=False), param_groups=[{"params": [weight]}])


def test_two_torchrun_processes_adapt_the_backbone_as_one_process_at_twice_the_batch(data, tmp_path):
    def options(out, batch_size):  # no LoRA dropout: its random masks would differ between the runs
        return [
            "adapt",
            "--backbone",
            "tiny-random",
            "--device",
            "cpu",
            "--data",
            str(data),
            "--out",
            str(out),
            "--batch-size",
            str(batch_size),
            "--lr",
            "0.01",
            "--dropout",
            "0",
            "--quiet",
        ]

    assert main(options(tmp_path / "single", 4)) == 0
    under_torchrun(options(tmp_path / "double", 2))
    base = load_backbone("tiny-random", device="cpu").model.state_dict()
    one, two = (load_file(tmp_path / name / "model.safetensors") for name in ("single", "double"))
    changed = [name for name in one if name in base and not torch.equal(one[name], base[name])]
    assert changed  # the merged LoRA moved the attention weights
    assert all(torch.allclose(one[name], two[name], rtol=1e-4, atol=1e-4) for name in one)  # moved by ~0.1
