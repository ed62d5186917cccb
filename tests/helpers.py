"""Helpers shared by the test modules."""

import torch


def random_rows(bank, seed: int = 0, scale: float = 1.0) -> None:
    """Give every row of the bank distinct random values (index and, for DC, a different steer)."""
    generator = torch.Generator().manual_seed(seed)
    bank.index = torch.randn(bank.index.shape, generator=generator) * scale
    if bank.decoupled:
        bank.steer = torch.randn(bank.steer.shape, generator=generator) * scale
