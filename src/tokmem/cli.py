"""The ``tokmem`` command."""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields

from rich.markdown import Markdown
from rich.table import Table

import tokmem
from tokmem.demo import DemoConfig
from tokmem.errors import TokMemError
from tokmem.experiments import compositional, placement
from tokmem.report import console, error_console, machine, percent, scores_table, trace_table, write_json


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "handler"):
        parser.print_help()
        return 2
    try:
        args.handler(args)
    except TokMemError as err:
        error_console.print(f"[bold red]error:[/bold red] {err}", highlight=False)
        return 2
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokmem", description="One-token procedural memory for frozen language models.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {tokmem.__version__}")
    commands = parser.add_subparsers(metavar="COMMAND")

    demo = commands.add_parser("demo", help="learn the built-in procedures and report routing, answers and chains")
    demo.add_argument("--backbone", default=DemoConfig.backbone)
    demo.add_argument("--epochs", type=int, default=DemoConfig.epochs)
    demo.add_argument("--batch-size", type=int, default=DemoConfig.batch_size)
    demo.add_argument("--lr", type=float, default=DemoConfig.lr)
    demo.add_argument("--decoupled", action=argparse.BooleanOptionalAction, default=DemoConfig.decoupled,
                      help="separate index and steer matrices (TokMem+DC; the default)")
    demo.add_argument("--train-per-procedure", type=int, default=DemoConfig.train_per_procedure,
                      help="training queries per procedure")
    demo.add_argument("--procedures", type=name_list, help="comma-separated built-in procedures to learn (default: all)")
    demo.add_argument("--out", help="also save the trained bank here (.safetensors)")
    _common(demo)
    demo.set_defaults(handler=cmd_demo)

    train = commands.add_parser("train", help="learn a new bank from a procedures JSONL file")
    train.add_argument("--data", required=True, help="procedures JSONL (query, steps[procedure, response])")
    train.add_argument("--out", required=True, help="bank file to write (.safetensors, plus .json beside it)")
    train.add_argument("--backbone", default="smollm2-135m")
    train.add_argument("--decoupled", action="store_true", help="separate index and steer matrices (TokMem+DC)")
    _training_options(train)
    train.set_defaults(handler=cmd_train)

    add = commands.add_parser("add", help="continual learning: add the new procedures of a file to a bank")
    add.add_argument("--bank", required=True)
    add.add_argument("--data", required=True)
    add.add_argument("--out", help="where to write the grown bank (default: overwrite --bank)")
    add.add_argument("--no-renorm", action="store_true", help="skip renormalising the new rows")
    _training_options(add)
    add.set_defaults(handler=cmd_add)

    run = commands.add_parser("run", help="answer queries with a bank (routing and chaining)")
    run.add_argument("--bank", required=True)
    run.add_argument("queries", nargs="+")
    run.add_argument("--procedure", help="force this procedure (skip routing)")
    run.add_argument("--top-k", type=int, default=3, help="routing candidates to show")
    _decode_options(run)
    _common(run)
    run.set_defaults(handler=cmd_run)

    evaluate = commands.add_parser("eval", help="routing accuracy, exact match and ROUGE-L on a JSONL file")
    evaluate.add_argument("--bank", required=True)
    evaluate.add_argument("--data", required=True)
    _decode_options(evaluate)
    _common(evaluate)
    evaluate.set_defaults(handler=cmd_eval)

    bank = commands.add_parser("bank", help="inspect and edit bank files").add_subparsers(metavar="ACTION")
    show = bank.add_parser("show", help="list the procedures, norms and backbone of a bank")
    show.add_argument("bank")
    show.add_argument("--json", metavar="PATH")
    show.set_defaults(handler=cmd_bank_show)
    rm = bank.add_parser("rm", help="remove procedures")
    rm.add_argument("bank")
    rm.add_argument("names", nargs="+")
    rm.set_defaults(handler=cmd_bank_rm)
    rename = bank.add_parser("rename", help="rename a procedure")
    rename.add_argument("bank")
    rename.add_argument("old")
    rename.add_argument("new")
    rename.set_defaults(handler=cmd_bank_rename)
    merge = bank.add_parser("merge", help="merge banks trained for the same backbone")
    merge.add_argument("banks", nargs="+")
    merge.add_argument("--out", required=True)
    merge.set_defaults(handler=cmd_bank_merge)

    bench = commands.add_parser("bench", help="the paper's studies: atomic recall, memory placement")
    studies = bench.add_subparsers(metavar="STUDY")
    _bench_atomic(studies)
    placement.add_parser(studies)
    compositional.add_parser(studies)
    return parser


def int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got '{text}'") from None


def name_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _bench_atomic(studies) -> None:
    atomic = studies.add_parser(
        "atomic", help="atomic recall on SNI: TokMem vs Base, RAG, LoRA, replay, TokMem+DC",
        description="Tasks arrive one at a time in task-id order; after each checkpoint every method answers the "
        "test queries of all tasks seen so far. Writes the JSON (after every checkpoint), a markdown table and a PNG plot.",
    )
    atomic.add_argument("--preset", choices=["cpu", "paper"], default="cpu",
                        help="sizes: cpu = the SNI files in ../shared/data/sni/tasks on smollm2-135m (default); "
                        "paper = 1000 tasks × 500/50, Qwen2.5-0.5B-Instruct (GPU, full natural-instructions)")
    atomic.add_argument("--tasks-dir", help="folder of SNI task files (natural-instructions/tasks)")
    atomic.add_argument("--num-tasks", type=int, help="tasks to load (default: the last checkpoint)")
    atomic.add_argument("--train-per-task", type=int)
    atomic.add_argument("--test-per-task", type=int)
    atomic.add_argument("--checkpoints", type=int_list, help="numbers of tasks to evaluate after, e.g. 5,10,14")
    atomic.add_argument("--methods", type=name_list, help="comma-separated subset of base,rag,lora,replay,tokmem,tokmem-dc")
    atomic.add_argument("--backbone")
    atomic.add_argument("--epochs", type=int)
    atomic.add_argument("--max-new-tokens", type=int)
    atomic.add_argument("--eval-batch-size", type=int)
    atomic.add_argument("--rag-k", type=int, help="demonstrations RAG retrieves (default 2)")
    atomic.add_argument("--lora-rank", type=int, help="default 8 (1 with --sample-efficiency)")
    atomic.add_argument("--tokmem-lr", type=float, help="learning rate of the memory rows (default 5e-3)")
    atomic.add_argument("--lora-lr", type=float, help="learning rate of LoRA and replay (default 5e-5)")
    atomic.add_argument("--sample-efficiency", action="store_true", default=None,
                        help="10 tasks learned as one mixture with 10/20/50/100/200/500 training examples per task")
    atomic.add_argument("--budgets", type=int_list, help="training examples per task for --sample-efficiency")
    atomic.add_argument("--out-dir", help="where the table, plot and method states go (default: beside --json)")
    atomic.add_argument("--resume", action="store_true", help="continue the run in --json: skip its finished checkpoints")
    atomic.add_argument("--json", metavar="PATH", required=True, help="the result file (written after every checkpoint)")
    atomic.add_argument("--device", help="cpu, cuda, … (default: cuda when available)")
    atomic.add_argument("--seed", type=int)
    atomic.add_argument("--quiet", action="store_true", help="no progress bars")
    atomic.set_defaults(handler=cmd_bench_atomic)


def _common(parser) -> None:
    parser.add_argument("--json", metavar="PATH", help="also write the numbers as JSON")
    parser.add_argument("--device", help="cpu, cuda, … (default: cuda when available)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def _training_options(parser) -> None:
    parser.add_argument("--catalog", help="JSONL of {name, description} per procedure")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument("--max-steps", type=int)
    parser.add_argument("--checkpoint-every", type=int, default=0, help="save the bank every N optimiser steps")
    _common(parser)


def _decode_options(parser) -> None:
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--max-steps", type=int, default=4, help="most memory tokens (segments) per answer")
    parser.add_argument("--threshold", type=float, default=0.5, help="open-set rule: minimum memory mass to route")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--batch-size", type=int, default=16)


def _train_config(args, out_path):
    from tokmem.train import TrainConfig

    return TrainConfig(
        lr=args.lr, weight_decay=args.weight_decay, epochs=args.epochs, batch_size=args.batch_size,
        grad_accum=args.grad_accum, max_length=args.max_length, max_steps=args.max_steps, seed=args.seed,
        renormalize=not getattr(args, "no_renorm", False), progress=not args.quiet,
        checkpoint=str(out_path) if args.checkpoint_every else None, checkpoint_every=args.checkpoint_every,
    )


def _decode_config(args):
    from tokmem.decode import DecodeConfig

    return DecodeConfig(
        max_new_tokens=args.max_new_tokens, max_steps=args.max_steps, threshold=args.threshold,
        temperature=args.temperature, batch_size=args.batch_size, seed=args.seed,
    )


def _learn_and_save(model, args, out_path) -> None:
    from tokmem.data import load_catalog, load_examples
    from tokmem.train import learn

    examples = load_examples(args.data)
    descriptions = load_catalog(args.catalog) if args.catalog else None
    report = learn(model, examples, _train_config(args, out_path), descriptions=descriptions)
    model.bank.save(out_path)
    summary = report.summary()
    console.print(
        f"learned {len(report.new_procedures)} new procedures ({len(model.bank)} in the bank) from {len(examples)} examples: "
        f"{summary['steps']} steps, {summary['seconds']} s, {summary['tokens_per_s']} tokens/s, final loss {summary['final_loss']:.3f}"
    )
    if report.truncated:
        console.print(f"[yellow]truncated to --max-length {args.max_length}: {report.truncated.queries} queries, {report.truncated.responses} responses[/yellow]")
    console.print(f"saved {out_path}")
    if args.json:
        write_json(args.json, {"bank": str(out_path), "procedures": model.bank.names, "train": summary, "machine": machine()})


def cmd_demo(args) -> None:
    from tokmem.demo import run_demo

    config = DemoConfig(args.backbone, args.epochs, args.batch_size, args.lr, args.decoupled, args.seed, args.train_per_procedure,
                        args.procedures)
    result = run_demo(config, device=args.device, progress=not args.quiet, bank_path=args.out)
    if args.json:
        write_json(args.json, result)


def cmd_train(args) -> None:
    from tokmem.model import create

    _learn_and_save(create(args.backbone, decoupled=args.decoupled, device=args.device), args, args.out)


def cmd_add(args) -> None:
    from tokmem.model import load

    _learn_and_save(load(args.bank, device=args.device), args, args.out or args.bank)


def cmd_run(args) -> None:
    from tokmem.decode import generate, route
    from tokmem.model import load

    model = load(args.bank, device=args.device)
    routes = route(model, args.queries, k=args.top_k)
    generations = generate(model, args.queries, _decode_config(args), procedure=args.procedure)
    results = []
    for r, g in zip(routes, generations):
        candidates = ", ".join(f"{name} {100 * p:.1f}%" for name, p in r.candidates)
        console.print(f"[bold]{g.query}[/bold]\n  routing: {candidates} (memory mass {100 * r.memory_mass:.1f}%)")
        for segment in g.trace:
            console.print(f"  [cyan]{segment.procedure or '(backbone)'}[/cyan] → {segment.text}", highlight=False)
        results.append({
            "query": g.query, "routed": g.routed, "memory_mass": r.memory_mass, "candidates": r.candidates,
            "trace": [{"procedure": s.procedure, "text": s.text} for s in g.trace], "text": g.text,
        })
    if args.json:
        write_json(args.json, {"bank": args.bank, "results": results})


def cmd_eval(args) -> None:
    from tokmem.data import load_examples
    from tokmem.evaluate import evaluate
    from tokmem.model import load

    model = load(args.bank, device=args.device)
    examples = load_examples(args.data, known_procedures=model.bank.names)
    result = evaluate(model, examples, _decode_config(args))
    console.print(scores_table(f"{args.data} ({len(examples)} examples)", result))
    if result["chain_examples"]:
        console.print(trace_table("chained examples", [r for r in result["predictions"] if len(r["gold"]) > 1]))
        console.print(f"chain accuracy {percent(result['chain_accuracy'])} over {result['chain_examples']} chains")
    if args.json:
        write_json(args.json, {"bank": args.bank, "data": args.data, **result, "machine": machine()})


def cmd_bench_atomic(args) -> None:
    from tokmem.experiments import atomic

    options = {f.name: getattr(args, f.name) for f in fields(atomic.AtomicConfig) if f.name != "preset" and hasattr(args, f.name)}
    config = atomic.make_config(args.preset, **options)
    result = atomic.run(config, json_path=args.json, out_dir=args.out_dir, resume=args.resume, progress=not args.quiet)
    study = atomic.EFFICIENCY if config.sample_efficiency else atomic.ATOMIC
    console.print(Markdown(atomic.markdown(result, study)))
    files = atomic.Files(args.json, args.out_dir)
    console.print(f"[dim]wrote {files.json}, {files.markdown}, {files.plot}[/dim]")


def cmd_bank_show(args) -> None:
    from tokmem.bank import MemoryBank

    bank = MemoryBank.load(args.bank)
    meta = bank.metadata()
    console.print(
        f"[bold]{args.bank}[/bold]: {len(bank)} procedures, width {bank.hidden_size}, "
        f"{'decoupled (index + steer)' if bank.decoupled else 'coupled'}, backbone {bank.backbone.get('name')} "
        f"({bank.backbone.get('fingerprint')}), {bank.parameter_count():,} parameters"
    )
    table = Table()
    for column in ("#", "procedure", "norm", "description"):
        table.add_column(column, overflow="fold")
    for row, (name, norm) in enumerate(zip(bank.names, meta["norms"]["per_row"])):
        table.add_row(str(row), name, f"{norm:.3f}", bank.descriptions[row])
    console.print(table)
    if args.json:
        write_json(args.json, meta)


def _edit(path, edit, out=None) -> None:
    from tokmem.bank import MemoryBank

    bank = MemoryBank.load(path)
    edit(bank)
    bank.save(out or path)
    console.print(f"saved {out or path}: {len(bank)} procedures")


def cmd_bank_rm(args) -> None:
    _edit(args.bank, lambda bank: [bank.remove(name) for name in args.names])


def cmd_bank_rename(args) -> None:
    _edit(args.bank, lambda bank: bank.rename(args.old, args.new))


def cmd_bank_merge(args) -> None:
    from tokmem.bank import MemoryBank

    _edit(args.banks[0], lambda bank: [bank.merge(MemoryBank.load(other)) for other in args.banks[1:]], out=args.out)


if __name__ == "__main__":
    sys.exit(main())
