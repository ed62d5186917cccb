"""Helpers shared by the test modules."""

import torch


def random_rows(bank, seed: int = 0, scale: float = 1.0) -> None:
    """Give every row of the bank distinct random values (index and, for DC, a different steer)."""
    generator = torch.Generator().manual_seed(seed)
    bank.index = torch.randn(bank.index.shape, generator=generator) * scale
    if bank.decoupled:
        bank.steer = torch.randn(bank.steer.shape, generator=generator) * scale


# banks the server tests serve: name -> (rows, decoupled); rows are random, scaled so that memory tokens
# and words both show up in greedy output on the lively backbone
SERVED_BANKS = {"alpha": (3, False), "beta": (4, True), "gamma": (1, False), "empty": (0, False)}


def write_bank(backbone, path, rows: int, decoupled: bool = False, seed: int = 0):
    """Save a bank of ``rows`` random rows (procedures p0, p1, …) tied to ``backbone``; returns its model."""
    import tokmem

    model = tokmem.create(backbone, decoupled=decoupled)
    if rows:
        model.bank.add([f"p{i}" for i in range(rows)], backbone.mean_embedding())
        random_rows(model.bank, seed=seed, scale=0.7)
    model.bank.save(path)
    return model


def write_served_banks(backbone, directory) -> dict:
    """Every bank of SERVED_BANKS in ``directory``; returns name -> model (the offline reference)."""
    return {
        name: write_bank(backbone, directory / f"{name}.safetensors", rows, decoupled, seed=i)
        for i, (name, (rows, decoupled)) in enumerate(SERVED_BANKS.items())
    }


def bank_files(path) -> tuple[bytes, bytes]:
    """(safetensors, JSON) bytes of a saved bank: what an upload sends."""
    from tokmem.bank import metadata_path

    return path.read_bytes(), metadata_path(path).read_bytes()
