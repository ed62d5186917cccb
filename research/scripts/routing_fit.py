"""Whether a kept tool-loop bank's routing fits its training records or only fails on new ones.

Each step of the ComplexFuncBench tool loop the bank was trained for (``--preset cpu --dataset complexfuncbench``,
the seed given), on its training records and on its test records alike, is routed with the gold calls and results
before it in context (as the study answers per step, ``tool_choice="required"``: the best tool row): the share of
steps whose memory token names the gold call's tool, by the call's place in its record.  Routing right on the
training records and wrong on the test records is a generalisation gap (more records or a prior would help); wrong
on both, a fitting one.  Then the index rows are refit on the training records' states (``tokmem.refit``, what
``tokmem train --refit-index`` does after training: the input rows, and so the states, unchanged) and route both
splits again: whether the states separate the tools at all, and how far such rows carry to new records.  Last, each
split routed as under ``tool_choice="auto"`` without a threshold: the vocabulary competing (the best of the words
and the bank's rows), the answers in words after a last result counted too (their target: the words).  No
decoding past the memory token; the backbone reads each record once (``tokmem.refit.routing_states``).

    OMP_NUM_THREADS=2 python -m research.scripts.routing_fit results/tails-qwen0.5b-banks/chains.safetensors \
        --seed 0 --json results/index-refit-qwen0.5b.json \
        --save-refit results/tails-qwen0.5b-banks/chains-index-refit.safetensors
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import torch

import tokmem
from tokmem.decoding.tool_rules import tool_routing
from tokmem.io import write_json_atomic
from tokmem.training.refit import RoutingStates, refit_index, routing_states
from tokmem.report import machine
from research.studies.compositional_config import make_config
from research.studies.tool_setup import tool_data
from tokmem.training.train import encode_examples


def chosen_rows(model, found: RoutingStates, index: torch.Tensor) -> list[int]:
    """The tool row each call's state routes to under index rows ``index``: ``tokmem.chat``'s choice under
    ``tool_choice="required"`` (the vocabulary and text rows left out)."""
    tools = tool_routing(model, None, "required", 0.0)[0].cpu()
    return found.logits(index.float())[:, 1:].masked_fill(~tools, float("-inf")).argmax(-1).tolist()


def by_place(chosen: list[int], gold: list[int], places: list[int]) -> dict:
    """Right routes of all steps and by the call's place in its record."""
    right, total = Counter(), Counter()
    for row, want, place in zip(chosen, gold, places):
        total[place] += 1
        right[place] += row == want
    counted = {str(k): f"{right[k]} of {total[k]}" for k in sorted(total)}
    return {"right": sum(right.values()), "steps": sum(total.values()), "by place": counted}


def calls(found: RoutingStates) -> RoutingStates:
    """The states of the calls alone (not of the answers in words after a last result)."""
    keep = found.rows >= 0
    return RoutingStates(found.states[keep], found.rows[keep], found.words[keep])


def call_places(model, encoded) -> list[int]:
    """Each call's place in its record, in the order ``routing_states`` reads them (record after record)."""
    return [k for e in encoded for k in range(1, 1 + sum(label >= model.vocab_size for label in e.labels))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("banks", nargs="+")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", required=True)
    parser.add_argument(
        "--save-refit",
        metavar="OUT",
        help="one bank: save it decoupled, the refit rows as its index side and its own rows steering "
        "(what tokmem train --refit-index writes; to answer with, reanswer_loop.py)",
    )
    args = parser.parse_args()
    if args.save_refit and len(args.banks) != 1:
        parser.error("--save-refit takes one bank")
    result = json.loads(Path(args.json).read_text()) if Path(args.json).is_file() else {"banks": {}}
    result |= {"seed": args.seed, "machine": machine()}
    for bank in args.banks:
        if bank in result["banks"]:  # resumable: a bank routed before is kept
            continue
        model = tokmem.load(bank, device="cpu")
        backbone = model.backbone.name.split("+")[0]
        config = make_config("cpu", dataset="complexfuncbench", backbone=backbone, seed=args.seed)
        data = tool_data(config, (1, config.tools))
        encoded = {  # each split laid out as the bank was trained on its records
            split: encode_examples(model, examples, config.train())
            for split, examples in (("train", data.train), ("test", data.test))
        }
        read = {split: routing_states(model, sequences, config.batch_size) for split, sequences in encoded.items()}
        own = model.bank.index.clone()
        model.bank.trainable[:] = True  # every row of the kept bank is the study's
        refit = refit_index(model, read["train"])
        if args.save_refit:
            model.bank.freeze()
            print(f"wrote {model.bank.save(args.save_refit)}")
        found = {split: (calls(read[split]), call_places(model, encoded[split])) for split in read}
        rows = (("the bank's rows", own), ("rows refit on train", model.bank.index))
        result["banks"][bank] = (
            {"refit on the training states": refit}
            | {
                f"{split}, {name}": by_place(chosen_rows(model, states, index), states.rows.tolist(), places)
                for name, index in rows
                for split, (states, places) in found.items()
            }
            | {
                f"{split}, {name}, against the words": f"{read[split].routed(index)} of {len(read[split].rows)}"
                for name, index in rows
                for split in read
            }
        )
        write_json_atomic(args.json, result)
        print(bank, json.dumps(result["banks"][bank]))


if __name__ == "__main__":
    main()
