"""One decoupled bank made of two kept banks' rows: one bank's rows route (the index side, read by the LM head),
the other's steer (the input side, the memory token the arguments follow) — to ask, without training, whether each
bank's strength survives beside the other's.

The first use: the tool loop's ``calls`` bank routes better, tokmem+schema's ``shown`` bank copies values better
(research/docs/studies.md); the bank made of the calls bank's index rows and the shown bank's rows as steer rows shows the
schema as the shown bank does, and is answered with ``reanswer_loop.py``:

    python -m research.scripts.bank_sides results/loop-ab-qwen0.5b-banks/calls.safetensors \
        results/loop-ab-qwen0.5b-banks/shown.safetensors results/loop-ab-qwen0.5b-banks/calls-route-shown-steer.safetensors
    OMP_NUM_THREADS=2 python -m research.scripts.reanswer_loop \
        results/loop-ab-qwen0.5b-banks/calls-route-shown-steer.safetensors --seed 0 \
        --rule "as the study answers" --json results/bank-sides-qwen0.5b.json
"""

from __future__ import annotations

import argparse

from tokmem.bank.memory_bank import MemoryBank
from tokmem.errors import BankError


def sides(routing: MemoryBank, steering: MemoryBank) -> MemoryBank:
    """A decoupled bank: ``routing``'s index rows, ``steering``'s input rows (its steer side, or its one matrix), and
    ``steering``'s layout (whether the chosen tool's schema is shown)."""
    if routing.names != steering.names or routing.backbone != steering.backbone:
        raise BankError("the two banks must hold the same rows, in the same order, for the same backbone")
    bank = MemoryBank(
        routing.hidden_size, decoupled=True, backbone=routing.backbone, shows_schemas=steering.shows_schemas
    )
    bank.add(routing.names, routing.index, routing.descriptions, routing.kinds, routing.schemas)
    bank.steer = steering.steer_matrix.clone()
    bank.freeze()
    return bank


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("routing", help="the bank whose index rows route")
    parser.add_argument("steering", help="the bank whose input rows (and layout) the answers follow")
    parser.add_argument("out")
    args = parser.parse_args()
    bank = sides(MemoryBank.load(args.routing), MemoryBank.load(args.steering))
    print(f"wrote {bank.save(args.out)}: {len(bank)} rows, shows schemas: {bank.shows_schemas}")


if __name__ == "__main__":
    main()
