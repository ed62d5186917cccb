"""Routing headroom on the demo data: how well can index rows route, given the training queries?

The hidden state at the routing position (the end of the query) does not depend on the bank, because
the memory token comes after the query.  So the decoupled variant's index rows, which learn from that
position alone, can be fitted offline on cached states with ``tokmem.train``'s optimiser, lr schedule and example
order (its paper defaults: AdamW, constant lr; rows initialised to the mean embedding, softmax over vocabulary ∪ bank).  This isolates routing from
generation and shows whether more steps or more data per procedure would help.

    python -m research.scripts.routing_headroom --train-per-procedure 12,36 --lr 5e-3,2e-2 --epochs 3,8
"""

from __future__ import annotations

import argparse

import torch

from tokmem import create
from tokmem.cli.options import int_list
from tokmem.data.builtin import demo_dataset
from tokmem.decoding.decode import pad_queries
from tokmem.model import positions
from tokmem.report import console, machine, write_json
from tokmem.training.train import TrainConfig, epoch_order, optimizer_and_schedule
from tokmem.cli.options import add_backbone


@torch.no_grad()
def routing_states(model, queries: list[str], batch_size: int = 32) -> torch.Tensor:
    """Final hidden state at the routing position of each query (no memory rows involved)."""
    empty = torch.zeros(0, model.backbone.hidden_size)
    out = []
    for i in range(0, len(queries), batch_size):
        ids, mask = pad_queries(model, queries[i : i + batch_size])
        hidden, _ = model.hidden(ids, mask, positions(mask), steer=empty)
        out.append(hidden[:, -1].float())
    return torch.cat(out)


def fit_index(data: dict, config: TrainConfig) -> tuple[int, float, float]:
    """Train index rows on cached states with ``config``'s optimiser, schedule, epochs, batches and seed (those of
    ``tokmem.train``); (steps, train accuracy, test accuracy)."""
    torch.manual_seed(config.seed)
    states, labels, vocab_logits = data["train"]
    index = torch.nn.Parameter(data["mean"].repeat(int(labels.max()) + 1, 1))
    order = epoch_order(len(labels), config.epochs, config.seed)
    steps = [torch.tensor(order[i : i + config.batch_size]) for i in range(0, len(order), config.batch_size)]
    optimizer, schedule = optimizer_and_schedule([index], config, len(steps))
    for batch in steps:
        logits = torch.cat([vocab_logits[batch], states[batch] @ index.T], dim=-1)
        loss = torch.nn.functional.cross_entropy(logits, labels[batch] + vocab_logits.shape[1])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    with torch.no_grad():
        accuracy = [((s @ index.T).argmax(-1) == y).float().mean().item() for s, y, _ in (data["train"], data["test"])]
    return len(steps), *accuracy


def cached_split(model, per_procedure: int) -> dict:
    train, test = demo_dataset(seed=0, train_per_procedure=per_procedure)
    rows = {name: i for i, name in enumerate(sorted({p for e in train for p in e.procedures}))}
    head = model.lm.get_output_embeddings().weight.float()

    def split(examples):
        states = routing_states(model, [e.query for e in examples])
        return states, torch.tensor([rows[e.procedures[0]] for e in examples]), states @ head.T

    return {"train": split(train), "test": split(test), "mean": model.backbone.mean_embedding().float()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_backbone(parser)
    parser.add_argument("--train-per-procedure", type=int_list, default=[12, 36])
    parser.add_argument("--lr", type=lambda s: [float(x) for x in s.split(",")], default=[5e-3, 2e-2])
    parser.add_argument("--epochs", type=int_list, default=[3, 8])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    model = create(args.backbone)
    rows = []
    for per_procedure in args.train_per_procedure:
        data = cached_split(model, per_procedure)
        for lr in args.lr:
            for epochs in args.epochs:
                config = TrainConfig(lr=lr, epochs=epochs, batch_size=args.batch_size)
                steps, train_acc, test_acc = fit_index(data, config)
                rows.append(
                    dict(
                        train_per_procedure=per_procedure,
                        lr=lr,
                        epochs=epochs,
                        steps=steps,
                        train_routing=train_acc,
                        test_routing=test_acc,
                    )
                )
                console.print(
                    f"{per_procedure} per procedure, lr {lr:g}, {epochs} epochs ({steps} steps): "
                    f"train {100 * train_acc:.1f}%, held-out {100 * test_acc:.1f}%"
                )
    if args.json:
        write_json(args.json, {"config": vars(args), "results": rows, "machine": machine()})


if __name__ == "__main__":
    main()
