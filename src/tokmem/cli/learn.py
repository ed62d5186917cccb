"""``tokmem demo``, ``train``, ``add`` and ``adapt``: the commands that learn."""

from __future__ import annotations

import argparse
from pathlib import Path

from tokmem.training import distributed
from tokmem.training.adapt import AdaptConfig
from tokmem.bank.memory_bank import MEMORY_TOKENS, SHARED_TOKENS
from tokmem.backbones import default_device, default_dtype
from tokmem.cli.options import add_backbone, add_common, add_off_topic, add_options, off_topic_specs, values
from tokmem.data.tool_datasets import ADAPTATION_SAMPLES
from tokmem.demo import DemoConfig
from tokmem.errors import TokMemError
from tokmem.report import console, machine, print_fallbacks, print_restraints, write_json
from tokmem.training.train import PICKED_RECIPE, UPDATES_PER_ROW, TrainConfig, picked_config
from tokmem.training.train_state import remove as remove_training_state

# tokmem adapt's options of the temporary rows (beside --rows-lr and --seed), and of its checkpoints (beside --out)
ADAPT_ROWS = ("epochs", "batch_size", "max_length", "schedule")
ADAPT_CHECKPOINTS = ("checkpoint_every", "resume")
BUILTIN_ADAPTATION = ("tools", "chains")  # tokmem adapt's data without --data (``builtin_adaptation``)


def add_commands(commands) -> None:
    demo = commands.add_parser("demo", help="learn the built-in procedures and report routing, answers and chains")
    add_options(demo, DemoConfig, skip=("seed",))
    demo.add_argument("--out", help="also save the trained bank here (.safetensors)")
    add_common(demo)
    demo.set_defaults(handler=cmd_demo)

    train = commands.add_parser("train", help="learn a new bank from a procedures JSONL file")
    train.add_argument("--data", required=True, help="procedures JSONL (query, steps[procedure, response])")
    train.add_argument("--out", required=True, help="bank file to write (.safetensors, plus .json beside it)")
    add_backbone(train)
    train.add_argument(
        "--decoupled",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="separate index and steer matrices (TokMem+DC; the default: on the travel example's phrasing-disjoint "
        "validation split it routed best, docs/results.md; --no-decoupled: one shared matrix, the paper's TokMem)",
    )
    train.add_argument(
        "--show-schemas",
        action="store_true",
        help="tokmem+schema: show each chosen tool's schema between its memory token and its arguments, in "
        "training and in tokmem.chat and tokmem serve (one call a turn; the vLLM plugin does not decode such a bank "
        "yet)",
    )
    train.add_argument(
        "--memory-tokens",
        type=int,
        default=MEMORY_TOKENS,
        help="memory tokens a tool: the first routes, the others (its tail) follow it as context for the arguments, "
        "one row of parameters each (tools only)",
    )
    train.add_argument(
        "--shared-tokens",
        type=int,
        default=SHARED_TOKENS,
        help="rows every tool reads after its own memory tokens, trained on all the tools' calls in this first "
        "round and frozen after (tools only)",
    )
    _training_options(train)
    train.set_defaults(handler=cmd_train)

    add = commands.add_parser("add", help="continual learning: add the new procedures of a file to a bank")
    add.add_argument("--bank", required=True)
    add.add_argument("--data", required=True)
    add.add_argument("--out", help="where to write the grown bank (default: overwrite --bank)")
    _training_options(add)
    add.set_defaults(handler=cmd_add)
    _add_adapt(commands)


def _add_adapt(commands) -> None:
    adapt = commands.add_parser(
        "adapt",
        help="the adaptation phase: teach a backbone to read and chain memory tokens, saved as a new backbone",
        description="LoRA trains with temporary memory rows on held-out procedures, is merged into the backbone and the "
        "rows are dropped. Default data: the built-in adaptation tools (--builtin). With --checkpoint-every N the phase (the "
        "LoRA weights and the rows) is saved beside --out as OUT.checkpoint.safetensors, which --resume goes on from "
        "and which is removed once the adapted backbone is saved.",
    )
    add_backbone(adapt)
    adapt.add_argument(
        "--out", required=True, help="new directory for the adapted backbone (use it as --backbone later)"
    )
    adapt.add_argument("--data", help="procedures JSONL of held-out procedures (default: the built-in data, --builtin)")
    adapt.add_argument(
        "--builtin",
        choices=BUILTIN_ADAPTATION,
        default="tools",
        help="built-in data without --data: 'tools', the reference code's set (single and composed calls over 25 "
        "built-in adaptation tools, no results); 'chains', synthetic tool chains whose later calls copy ids out of "
        "earlier calls' results (12 tools of their own; what a tool loop with results in context adapted best on, "
        "research/docs/studies.md)",
    )
    adapt.add_argument(
        "--samples",
        type=int,
        default=ADAPTATION_SAMPLES,
        help="built-in data: queries in all ('tools': 50 single-tool samples a tool, then composed ones)",
    )
    add_options(adapt, AdaptConfig)
    add_options(adapt, TrainConfig, names=("lr",), prefix="rows_")
    add_options(adapt, TrainConfig, names=ADAPT_ROWS)
    add_options(adapt, TrainConfig, names=ADAPT_CHECKPOINTS)
    add_common(adapt)
    adapt.set_defaults(handler=cmd_adapt)


def _training_options(parser) -> None:
    parser.add_argument(
        "--catalog",
        help="the procedures' {name, description, parameters (a tool's JSON schema, optional)}: JSON lines or a list",
    )
    add_off_topic(parser)
    add_options(parser, TrainConfig, skip=("seed", "epochs"), recipe=PICKED_RECIPE)  # --seed is common
    parser.add_argument(
        "--epochs",
        type=int,
        help=f"passes over the examples (default: enough for {UPDATES_PER_ROW} updates per new procedure)",
    )
    add_common(parser)


def _train_config(args, out_path, examples, new_rows: int) -> TrainConfig:
    return picked_config(
        examples,
        new_rows,
        **values(args, TrainConfig),
        progress=not args.quiet,
        checkpoint=str(out_path) if args.checkpoint_every else None,
    )


def _learn_and_save(load_model, args, out_path) -> None:
    """Reads the data and checks the settings before ``load_model`` loads the backbone, so that bad input is refused
    at once."""
    from tokmem.data import load_catalog, load_examples
    from tokmem.data.procedures import load_schemas
    from tokmem.eval.open_set import restraints
    from tokmem.training.train import learn

    examples = load_examples(args.data)
    descriptions = load_catalog(args.catalog) if args.catalog else None
    schemas = load_schemas(args.catalog) if args.catalog else None
    _train_config(args, out_path, examples, new_rows=0)
    model = load_model()
    new_rows = len({p for e in examples for p in e.procedures} - set(model.bank.names))
    config = _train_config(args, out_path, examples, new_rows)
    if distributed.is_main():
        picked = "" if args.epochs else f" (picked for {new_rows} new procedures; --epochs sets it)"
        console.print(f"training {config.epochs} epochs{picked} at lr {config.lr:g}, {config.schedule} schedule")
    report = learn(model, examples, config, descriptions=descriptions, schemas=schemas)
    in_domain = [e for e in examples if e.steps]
    fallbacks = _training_fallbacks(model, in_domain)  # on every rank: a sharded backbone's passes need them all
    off_topic = restraints(model, off_topic_specs(args))
    if not distributed.is_main():  # under torchrun / accelerate every rank holds the same bank: one writes it
        return
    model.bank.save(out_path)
    remove_training_state(out_path)  # the checkpoints' (nothing is left to resume)
    summary = report.summary()
    console.print(
        f"learned {len(report.new_procedures)} new procedures ({len(model.bank)} in the bank) from {len(examples)} examples: "
        f"{summary['steps']} steps, {summary['seconds']} s, {summary['tokens_per_s']} tokens/s, final loss {summary['final_loss']:.3f}"
    )
    if report.refit:
        console.print(
            f"routing side refit on the training states: {report.refit['routed_after']} of {report.refit['states']} "
            f"routing positions right, a memory token or words where none fits (before: "
            f"{report.refit['routed_before']}), {report.refit['seconds']} s"
        )
    if report.key_sets:
        console.print(
            f"key-set rows: {report.key_sets['key_sets']} for {report.key_sets['tools']} tools whose training calls "
            f"write several key sets; they choose {report.key_sets['chosen_right']} of those "
            f"{report.key_sets['calls']} calls' key sets right"
        )
    if report.truncated:
        warning = report.truncated.describe(len(examples), args.max_length)
        console.print(f"[yellow]warning: {warning}; raise --max-length to keep them whole[/yellow]", highlight=False)
    if report.negatives:
        console.print(
            f"trained beside {report.negatives} built-in off-topic queries (--negatives {config.negatives:g})"
        )
    print_fallbacks(fallbacks, len(in_domain), "training queries", f"--epochs {2 * config.epochs}")
    print_restraints(off_topic)
    console.print(f"saved {out_path}")
    if args.json:
        summary |= {"open_set_fallbacks": fallbacks, "off_topic": off_topic}
        write_json(
            args.json, {"bank": str(out_path), "procedures": model.bank.names, "train": summary, "machine": machine()}
        )


def _training_fallbacks(model, examples) -> int:
    """How many training queries the trained bank leaves to the plain backbone (memory mass below the threshold)."""
    from tokmem.decoding.decode import open_set_threshold, route

    threshold = open_set_threshold(model.bank)
    return sum(r.memory_mass < threshold for r in route(model, [e.query for e in examples]))


def cmd_demo(args) -> None:
    from tokmem.demo import run_demo

    config = DemoConfig(**values(args, DemoConfig))
    result = run_demo(config, device=args.device, progress=not args.quiet, bank_path=args.out)
    if args.json:
        write_json(args.json, result)


def cmd_train(args) -> None:
    from tokmem.model import create

    _learn_and_save(
        lambda: create(
            args.backbone,
            decoupled=args.decoupled,
            shows_schemas=args.show_schemas,
            memory_tokens=args.memory_tokens,
            shared_tokens=args.shared_tokens,
            **_load_options(args),
        ),
        args,
        args.out,
    )


def cmd_add(args) -> None:
    from tokmem.model import load

    if args.checkpoint_every and not args.out:
        raise TokMemError("--checkpoint-every saves the bank as it trains: give --out, or it would overwrite --bank")
    _learn_and_save(lambda: load(args.bank, **_load_options(args)), args, args.out or args.bank)


def _load_options(args) -> dict:
    """Where the backbone loads: with ``--fsdp`` on the CPU first (in the dtype of the device its shards go to), so
    that no process holds the whole backbone on its device."""
    if not args.fsdp:
        return {"device": args.device}
    return {"device": "cpu", "dtype": default_dtype(default_device())}


def adapt_settings(args) -> tuple[AdaptConfig, TrainConfig]:
    """``tokmem adapt``'s LoRA and temporary rows, from its options."""
    rows = TrainConfig(
        **values(args, TrainConfig, prefix="rows_", names=("lr",)),
        **values(args, TrainConfig, names=(*ADAPT_ROWS, *ADAPT_CHECKPOINTS, "seed")),
        checkpoint=adapt_checkpoint(args.out) if args.checkpoint_every else None,
        progress=not args.quiet,
    )
    return AdaptConfig(**values(args, AdaptConfig)), rows


def builtin_adaptation(name: str, samples: int, seed: int) -> list:
    """``samples`` queries of the built-in adaptation data ``name`` (`BUILTIN_ADAPTATION`), seeded."""
    from tokmem.data.tool_chains import tool_chains
    from tokmem.data.tool_datasets import adaptation_examples

    return tool_chains(samples, seed) if name == "chains" else adaptation_examples(samples, seed=seed)


def adapt_checkpoint(out) -> str:
    """Where ``tokmem adapt --checkpoint-every`` saves the phase: beside the directory it will write."""
    return f"{Path(out)}.checkpoint.safetensors"


def cmd_adapt(args) -> None:
    from tokmem.training.adapt import adapt
    from tokmem.backbones import load_backbone
    from tokmem.data import load_examples

    if Path(args.out).exists():
        raise TokMemError(f"{args.out} already exists: give --out a new directory")
    examples = load_examples(args.data) if args.data else builtin_adaptation(args.builtin, args.samples, args.seed)
    lora, rows = adapt_settings(args)
    backbone = load_backbone(args.backbone, device=args.device)
    adapted = adapt(backbone, examples, lora, rows, save_to=args.out, inplace=True)
    if not distributed.is_main():
        return
    procedures = len({p for e in examples for p in e.procedures})
    console.print(
        f"adapted {args.backbone} on {len(examples)} queries over {procedures} procedures; saved {adapted.name}"
    )
    console.print(f"use it with --backbone {adapted.name}")
    if args.json:
        write_json(
            args.json,
            {
                "backbone": adapted.name,
                "base": args.backbone,
                "data": args.data or f"built-in {args.builtin}",
                "examples": len(examples),
                "procedures": procedures,
                "fingerprint": adapted.fingerprint(),
                "machine": machine(),
            },
        )
