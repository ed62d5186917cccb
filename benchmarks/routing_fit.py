"""Whether a kept tool-loop bank's routing fits its training records or only fails on new ones.

Each step of the ComplexFuncBench tool loop the bank was trained for (``--preset cpu --dataset complexfuncbench``,
the seed given), on its training records and on its test records alike, is routed with the gold calls and results
before it in context (as the study answers per step, ``tool_choice="required"``: the best tool row): the share of
steps whose memory token names the gold call's tool, by the call's place in its record.  Routing right on the
training records and wrong on the test records is a generalisation gap (more records or a prior would help); wrong
on both, a fitting one (more updates or a stronger routing signal would).  No training, no decoding past the
memory token.

    OMP_NUM_THREADS=2 python benchmarks/routing_fit.py results/tails-qwen0.5b-banks/chains.safetensors \
        --seed 0 --json results/routing-fit-qwen0.5b.json
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import torch

import tokmem
from tokmem.chat import conversation_ids, tool_routing
from tokmem.eval.tool_loop import conversation
from tokmem.io import write_json_atomic
from tokmem.report import machine
from tokmem.studies.compositional_config import make_config
from tokmem.studies.harness import progress_bar
from tokmem.studies.tool_setup import tool_data


@torch.no_grad()
def routed(model, example) -> list[str]:
    """The tool row each step of ``example`` routes to, the gold steps before it in context (``tokmem.chat``'s
    choice under ``tool_choice="required"``)."""
    index, steer = model.memory_matrices()
    tools = tool_routing(model, None, "required", 0.0)[0]
    names = []
    for k in range(len(example.steps)):
        history = [(s.response, s.result) for s in example.steps[:k]]
        ids = torch.tensor([conversation_ids(model, conversation(example, history))], device=model.device)
        hidden, _ = model.hidden(ids, torch.ones_like(ids), steer=steer)
        rows = model.logits(hidden[:, -1], index)[0, model.vocab_size :].masked_fill(~tools, float("-inf"))
        names.append(model.bank.names[int(rows.argmax())])
    return names


def routing_by_place(model, examples, bar, what: str) -> dict:
    bar.phase(f"routing the {what} records' steps", len(examples))
    right, total = Counter(), Counter()
    for example in examples:
        for k, (name, step) in enumerate(zip(routed(model, example), example.steps)):
            total[k + 1] += 1
            right[k + 1] += name == step.procedure
        bar.update()
    places = {str(k): f"{right[k]} of {total[k]}" for k in sorted(total)}
    return {"right": sum(right.values()), "steps": sum(total.values()), "by place": places}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("banks", nargs="+")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    result = json.loads(Path(args.json).read_text()) if Path(args.json).is_file() else {"banks": {}}
    result |= {"seed": args.seed, "machine": machine()}
    bar = progress_bar(True)
    for bank in args.banks:
        if bank in result["banks"]:  # resumable: a bank routed before is kept
            continue
        model = tokmem.load(bank, device="cpu")
        backbone = model.backbone.name.split("+")[0]
        config = make_config("cpu", dataset="complexfuncbench", backbone=backbone, seed=args.seed)
        data = tool_data(config, (1, config.tools))
        splits = {"train": data.train, "test": data.test}
        result["banks"][bank] = {
            split: routing_by_place(model, examples, bar, split) for split, examples in splits.items()
        }
        write_json_atomic(args.json, result)
        print(bank, json.dumps(result["banks"][bank]))
    bar.close()


if __name__ == "__main__":
    main()
