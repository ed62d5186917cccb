"""The embedded demo: learn the built-in procedures, then route, answer and chain held-out queries."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from tokmem.data import builtin
from tokmem.decode import DecodeConfig
from tokmem.evaluate import evaluate
from tokmem.model import create
from tokmem.report import console, machine, scores_table, trace_table
from tokmem.train import TrainConfig, learn


@dataclass
class DemoConfig:
    """The demo's training recipe.

    The paper trains one epoch at batch 4 on hundreds of examples per procedure.  On smollm2-135m in a
    CPU budget, the demo routes best with the decoupled variant (the index rows then learn from the
    routing positions alone), three dozen queries per procedure, batch 32 and three epochs (measured:
    see the README).
    """

    backbone: str = "smollm2-135m"
    epochs: int = 3
    batch_size: int = 32
    lr: float = 5e-3
    decoupled: bool = True
    seed: int = 0
    train_per_procedure: int = 36


def run_demo(config: DemoConfig | None = None, device: str | None = None, progress: bool = True, bank_path=None) -> dict:
    config = config or DemoConfig()
    train_set, test_set = builtin.demo_dataset(seed=config.seed, train_per_procedure=config.train_per_procedure)
    console.print(
        f"[bold]tokmem demo[/bold]: {len(builtin.PROCEDURES)} procedures, {len(train_set)} training and "
        f"{len(test_set)} held-out queries, backbone {config.backbone}"
    )
    model = create(config.backbone, decoupled=config.decoupled, device=device)
    train_config = TrainConfig(epochs=config.epochs, batch_size=config.batch_size, lr=config.lr, seed=config.seed, progress=progress)
    report = learn(model, train_set, train_config, descriptions=builtin.catalog())
    console.print(
        f"trained {len(model.bank)} memory tokens ({model.bank.parameter_count():,} "
        f"parameters) in {report.seconds:.0f} s, {report.tokens_per_s:.0f} tokens/s, final loss {report.losses[-1]:.3f}"
    )
    if bank_path:
        console.print(f"saved {model.bank.save(bank_path)}")
    start = time.perf_counter()
    result = evaluate(model, test_set, DecodeConfig(max_new_tokens=32, max_steps=3))
    eval_seconds = time.perf_counter() - start
    console.print(scores_table("held-out queries", result))
    chains = [r for r in result["predictions"] if len(r["gold"]) > 1]
    console.print(trace_table("chained generations", chains))
    console.print(
        f"routing accuracy {100 * result['routing_accuracy']:.1f}%, exact match {100 * result['exact_match']:.1f}%, "
        f"chain accuracy {100 * (result['chain_accuracy'] or 0):.1f}% (evaluation {eval_seconds:.0f} s)"
    )
    return {
        "backbone": config.backbone,
        "procedures": len(model.bank),
        "train_examples": len(train_set),
        "test_examples": len(test_set),
        "routing_accuracy": result["routing_accuracy"],
        "exact_match": result["exact_match"],
        "rougeL": result["rougeL"],
        "chain_accuracy": result["chain_accuracy"],
        "exact_match_per_procedure": {n: r["exact_match"] for n, r in result["per_procedure"].items()},
        "train_seconds": report.seconds,
        "eval_seconds": eval_seconds,
        "train": report.summary(),
        "config": asdict(config),
        "machine": machine(),
        "examples": chains[:6],
    }
