"""research/scripts/bank_sides.py: one decoupled bank of two banks' rows, one routing (index), the other steering."""

import pytest
import torch
from research.scripts import bank_sides

from tokmem.bank.memory_bank import MemoryBank
from tokmem.errors import BankError


def bank(seed: int, shows_schemas: bool = False, names=("a", "b")) -> MemoryBank:
    made = MemoryBank(4, backbone={"name": "tiny", "fingerprint": "f"}, shows_schemas=shows_schemas)
    made.add(names, torch.randn(len(names), 4, generator=torch.Generator().manual_seed(seed)))
    return made


def test_the_made_bank_routes_on_one_banks_rows_steers_on_the_others_and_keeps_the_steering_layout(tmp_path):
    routing, steering = bank(0), bank(1, shows_schemas=True)
    made = MemoryBank.load(bank_sides.sides(routing, steering).save(tmp_path / "made.safetensors"))
    assert made.decoupled and made.shows_schemas and made.names == ["a", "b"]
    assert torch.equal(made.index, routing.index) and torch.equal(made.steer, steering.index)


def test_banks_of_other_rows_are_refused():
    with pytest.raises(BankError, match="same rows, in the same order"):
        bank_sides.sides(bank(0), bank(1, names=("b", "a")))
