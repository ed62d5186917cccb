"""Whether a kept tool-loop bank's routing fits its training records or only fails on new ones.

Each step of the ComplexFuncBench tool loop the bank was trained for (``--preset cpu --dataset complexfuncbench``,
the seed given), on its training records and on its test records alike, is routed with the gold calls and results
before it in context (as the study answers per step, ``tool_choice="required"``: the best tool row): the share of
steps whose memory token names the gold call's tool, by the call's place in its record.  Routing right on the
training records and wrong on the test records is a generalisation gap (more records or a prior would help); wrong
on both, a fitting one.  Then output rows are fitted to the training steps' states alone (``refit_rows``: the
input rows, and so the states, unchanged, as a decoupled bank's index side could be), and route both splits again:
whether the states separate the tools at all, and how far such rows carry to new records.  No decoding past the
memory token; the backbone runs once a step.

    OMP_NUM_THREADS=2 python benchmarks/routing_fit.py results/tails-qwen0.5b-banks/chains.safetensors \
        --seed 0 --json results/routing-fit-qwen0.5b.json
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import torch
from bank_sides import sides  # a script beside this one (its folder is on the path when run)

import tokmem
from tokmem.bank import MemoryBank
from tokmem.chat import conversation_ids, tool_routing
from tokmem.eval.tool_loop import conversation
from tokmem.io import write_json_atomic
from tokmem.report import machine
from tokmem.studies.compositional_config import make_config
from tokmem.studies.harness import progress_bar
from tokmem.studies.tool_setup import tool_data


@torch.no_grad()
def step_states(model, example) -> torch.Tensor:
    """The final hidden state where each step's memory token is due (steps, d), the gold steps before it in context."""
    steer = model.memory_matrices()[1]
    states = []
    for k in range(len(example.steps)):
        history = [(s.response, s.result) for s in example.steps[:k]]
        ids = torch.tensor([conversation_ids(model, conversation(example, history))], device=model.device)
        states.append(model.hidden(ids, torch.ones_like(ids), steer=steer)[0][0, -1].float())
    return torch.stack(states)


def chosen_rows(model, states: torch.Tensor, index: torch.Tensor) -> list[int]:
    """The tool row each state routes to under output rows ``index``: ``tokmem.chat``'s choice under
    ``tool_choice="required"`` (the vocabulary and text rows left out)."""
    tools = tool_routing(model, None, "required", 0.0)[0]
    return (states @ index.float().T).masked_fill(~tools, float("-inf")).argmax(-1).tolist()


def routed(model, example) -> list[str]:
    """The tool row each step of ``example`` routes to, the gold steps before it in context."""
    return [model.bank.names[r] for r in chosen_rows(model, step_states(model, example), model.memory_matrices()[0])]


def by_place(chosen: list[int], gold: list[int], places: list[int]) -> dict:
    """Right routes of all steps and by the call's place in its record."""
    right, total = Counter(), Counter()
    for row, want, place in zip(chosen, gold, places):
        total[place] += 1
        right[place] += row == want
    counted = {str(k): f"{right[k]} of {total[k]}" for k in sorted(total)}
    return {"right": sum(right.values()), "steps": sum(total.values()), "by place": counted}


def refit_rows(model, states: torch.Tensor, gold: list[int], steps: int = 2000) -> torch.Tensor:
    """Output rows fitted to route ``states`` to their ``gold`` rows (cross-entropy over the tool rows, full batch,
    from the bank's rows), the input rows and so the states left as they are: what routing could reach on these
    states with other output rows (a decoupled bank's index side)."""
    tools = tool_routing(model, None, "required", 0.0)[0]
    rows = model.memory_matrices()[0].detach().float().clone().requires_grad_(True)
    optimizer = torch.optim.Adam([rows], lr=1e-3)
    target = torch.tensor(gold)
    for _ in range(steps):
        optimizer.zero_grad()
        logits = (states @ rows.T).masked_fill(~tools, float("-inf"))
        torch.nn.functional.cross_entropy(logits, target).backward()
        optimizer.step()
    return rows.detach()


def split_states(model, examples, bar, what: str) -> tuple[torch.Tensor, list[int], list[int]]:
    """(states, gold rows, call places) of every step of ``examples``."""
    bar.phase(f"the {what} records' steps", len(examples))
    states, gold, places = [], [], []
    for example in examples:
        states.append(step_states(model, example))
        gold += [model.bank.names.index(step.procedure) for step in example.steps]
        places += list(range(1, len(example.steps) + 1))
        bar.update()
    return torch.cat(states), gold, places


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("banks", nargs="+")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", required=True)
    parser.add_argument(
        "--save-refit",
        metavar="OUT",
        help="one bank: save it decoupled, the refit rows as its index side and its own rows steering "
        "(to answer with, reanswer_loop.py)",
    )
    args = parser.parse_args()
    if args.save_refit and len(args.banks) != 1:
        parser.error("--save-refit takes one bank")
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
        found = {split: split_states(model, examples, bar, split) for split, examples in splits.items()}
        refit = refit_rows(model, *found["train"][:2])
        if args.save_refit:
            routing = MemoryBank.load(bank)
            routing.index = refit.to(routing.index.dtype)
            print(f"wrote {sides(routing, MemoryBank.load(bank)).save(args.save_refit)}")
        result["banks"][bank] = {
            f"{split}, {rows}": by_place(chosen_rows(model, states, index), gold, places)
            for rows, index in (("the bank's rows", model.memory_matrices()[0]), ("rows refit on train", refit))
            for split, (states, gold, places) in found.items()
        }
        write_json_atomic(args.json, result)
        print(bank, json.dumps(result["banks"][bank]))
    bar.close()


if __name__ == "__main__":
    main()
