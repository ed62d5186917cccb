"""The embedded demo: learn the built-in procedures, then route, answer and chain held-out queries.

Beside TokMem, the same frozen backbone answers the same queries with written instructions in its
prompt instead of memory tokens: the gold procedures' instructions (routing is then the oracle's), and
every procedure's instructions (the backbone must pick the right one itself).  Prompt tokens per query
show what the memory tokens save.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

from rich.table import Table

from tokmem.backbones import backbone_option
from tokmem.config import config_from, option, option_of
from tokmem.eval import metrics
from tokmem.data import builtin
from tokmem.data.procedures import Example
from tokmem.decoding.decode import DecodeConfig, generate
from tokmem.eval.evaluate import evaluate
from tokmem.training.sequences import chat_prefix
from tokmem.model import TokMemModel, create
from tokmem.report import console, machine, numbers_table, percent, trace_table
from tokmem.training.train import TrainConfig, learn

DECODE = DecodeConfig(max_new_tokens=32, max_steps=3)


@dataclass
class DemoConfig:
    """The demo's training recipe.

    The paper trains one epoch at batch 4 on hundreds of examples per procedure.  On smollm2-135m in a
    CPU budget, the demo routes best with the decoupled variant (the index rows then learn from the
    routing positions alone), three dozen queries per procedure, batch 32 and three epochs.
    """

    backbone: str = backbone_option()
    epochs: int = option_of(TrainConfig, "epochs", "passes over the training queries", default=3)
    batch_size: int = option_of(TrainConfig, "batch_size", "training queries per step", default=32)
    lr: float = option_of(TrainConfig, "lr")
    decoupled: bool = option(True, "separate index and steer matrices (TokMem+DC; the default)")
    seed: int = field(default=TrainConfig.seed, metadata={"of": TrainConfig, "field": "seed"})
    train_per_procedure: int = option(36, "training queries per procedure")
    procedures: tuple[str, ...] | None = option(None, "comma-separated built-in procedures to learn (default: all)")


def prompt_tokens(tokenizer, prompts: list[str | list[dict]]) -> float:
    """Mean length in tokens of the prompts as the backbone reads them (chat template included)."""
    return metrics.mean(len(chat_prefix(tokenizer, p)) for p in prompts)


def instructed_scores(
    plain: TokMemModel,
    examples: list[Example],
    instructions: Callable[[Example], list[str]],
    config: DecodeConfig = DECODE,
) -> dict:
    """The plain backbone (``plain`` has an empty bank) answering each query after the written
    instructions of the procedures ``instructions(example)`` names: exact match overall and per
    procedure (single-step queries), and prompt tokens per query."""
    prompts = [builtin.instructed_prompt(instructions(e), e.query) for e in examples]
    start = time.perf_counter()
    answers = [g.text for g in generate(plain, prompts, replace(config, share_prefix=True))]
    matches = [metrics.exact_match(a, e.response) for a, e in zip(answers, examples)]
    per_procedure = {}
    for example, match in zip(examples, matches):
        if len(example.steps) == 1:
            per_procedure.setdefault(example.procedures[0], []).append(match)
    return {
        "exact_match": metrics.mean(matches),
        "chain_exact_match": metrics.mean(m for e, m in zip(examples, matches) if len(e.steps) > 1),
        "exact_match_per_procedure": {name: metrics.mean(m) for name, m in sorted(per_procedure.items())},
        "prompt_tokens": prompt_tokens(plain.backbone.tokenizer, prompts),
        "seconds": time.perf_counter() - start,
    }


def gold_procedures(example: Example) -> list[str]:
    return example.procedures


def run_demo(
    config: DemoConfig | None = None, device: str | None = None, progress: bool = True, bank_path=None
) -> dict:
    config = config or DemoConfig()
    names = list(config.procedures or builtin.PROCEDURES)
    train_set, test_set = builtin.demo_dataset(
        seed=config.seed, train_per_procedure=config.train_per_procedure, procedures=names
    )
    console.print(
        f"[bold]tokmem demo[/bold]: {len(names)} procedures, {len(train_set)} training and "
        f"{len(test_set)} held-out queries, backbone {config.backbone}"
    )
    model, report = learn_builtin(config, train_set, device, progress)
    if bank_path:
        console.print(f"saved {model.bank.save(bank_path)}")
    start = time.perf_counter()
    result = evaluate(model, test_set, DECODE)
    eval_seconds = time.perf_counter() - start
    chains = [r for r in result["predictions"] if len(r["gold"]) > 1]
    plain = create(model.backbone)  # an empty bank: the plain backbone
    instructed = instructed_scores(plain, test_set, gold_procedures)
    catalog = instructed_scores(plain, test_set, lambda _: names)
    tokmem_tokens = prompt_tokens(model.backbone.tokenizer, [e.query for e in test_set])
    chain_exact_match = metrics.mean(r["exact_match"] for r in chains)
    console.print(procedure_table(result, instructed, catalog))
    console.print(trace_table("chained generations (TokMem)", chains))
    console.print(method_table(result, chain_exact_match, tokmem_tokens, instructed, catalog))
    console.print(
        f"TokMem: routing accuracy {100 * result['routing_accuracy']:.1f}%, exact match {100 * result['exact_match']:.1f}%, "
        f"chain accuracy {100 * (result['chain_accuracy'] or 0):.1f}% (evaluation {eval_seconds:.0f} s; instructed "
        f"backbone {instructed['seconds']:.0f} s, with all instructions {catalog['seconds']:.0f} s)"
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
        "chain_exact_match": chain_exact_match,
        "exact_match_per_procedure": {n: r["exact_match"] for n, r in result["per_procedure"].items()},
        "tokmem_prompt_tokens": tokmem_tokens,
        "instruction_exact_match": instructed["exact_match"],
        "instruction_prompt_tokens": instructed["prompt_tokens"],
        "instruction_chain_exact_match": instructed["chain_exact_match"],
        "instruction_exact_match_per_procedure": instructed["exact_match_per_procedure"],
        "all_instructions_exact_match": catalog["exact_match"],
        "all_instructions_chain_exact_match": catalog["chain_exact_match"],
        "all_instructions_prompt_tokens": catalog["prompt_tokens"],
        "train_seconds": report.seconds,
        "eval_seconds": eval_seconds,
        "instruction_eval_seconds": instructed["seconds"] + catalog["seconds"],
        "train": report.summary(),
        "config": asdict(config),
        "machine": machine(),
        "examples": chains[:6],
    }


def learn_builtin(config: DemoConfig, train_set: list[Example], device: str | None, progress: bool):
    """A fresh bank on the backbone, trained on the built-in procedures' queries: the model and the report."""
    model = create(config.backbone, decoupled=config.decoupled, device=device)
    train_config = config_from(config, TrainConfig, progress=progress)
    report = learn(model, train_set, train_config, descriptions=builtin.catalog())
    console.print(
        f"trained {len(model.bank)} memory tokens ({model.bank.parameter_count():,} "
        f"parameters) in {report.seconds:.0f} s, {report.tokens_per_s:.0f} tokens/s, final loss {report.losses[-1]:.3f}"
    )
    return model, report


def procedure_table(result: dict, instructed: dict, catalog: dict) -> Table:
    """Per procedure: TokMem's routing and exact match beside the instructed backbone's exact match."""
    columns = ("procedure", "n", "TokMem routing", "TokMem", "+ its instruction", "+ all instructions")
    table = numbers_table("held-out queries: exact match", columns)
    for name, row in result["per_procedure"].items():
        table.add_row(
            name,
            str(row["examples"]),
            percent(row["routing_accuracy"]),
            percent(row["exact_match"]),
            percent(instructed["exact_match_per_procedure"][name]),
            percent(catalog["exact_match_per_procedure"][name]),
        )
    table.add_section()
    table.add_row(
        "[bold]all[/bold]",
        str(result["examples"]),
        percent(result["routing_accuracy"]),
        percent(result["exact_match"]),
        percent(instructed["exact_match"]),
        percent(catalog["exact_match"]),
    )
    return table


def method_table(
    result: dict, chain_exact_match: float, tokmem_tokens: float, instructed: dict, catalog: dict
) -> Table:
    """TokMem against the same backbone reading written instructions instead of memory tokens."""
    title = f"TokMem against the instructed backbone ({result['examples']} held-out queries, {result['chain_examples']} chains)"
    table = numbers_table(title, ("method", "routing", "exact match", "chains: exact match", "prompt tokens / query"))
    table.add_row(
        "TokMem (memory tokens)",
        percent(result["routing_accuracy"]),
        percent(result["exact_match"]),
        percent(chain_exact_match),
        f"{tokmem_tokens:.0f}",
    )
    table.add_row(
        "backbone + its instruction(s)",
        "oracle",
        percent(instructed["exact_match"]),
        percent(instructed["chain_exact_match"]),
        f"{instructed['prompt_tokens']:.0f}",
    )
    table.add_row(
        "backbone + all instructions",
        "–",
        percent(catalog["exact_match"]),
        percent(catalog["chain_exact_match"]),
        f"{catalog['prompt_tokens']:.0f}",
    )
    return table
