"""The ``tokmem`` command."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields

from rich.markdown import Markdown
from rich.markup import escape
from rich.table import Table

import tokmem
from tokmem.cli_types import int_list, name_list
from tokmem.demo import DemoConfig
from tokmem.errors import TokMemError
from tokmem.extras import require_extra
from tokmem.experiments import compositional, placement
from tokmem.report import (
    call_scores_table, console, error_console, machine, percent, scores_table, trace_table, write_json,
)
from tokmem.layout import RESULT_TOKENS
from tokmem.train import INITS, SCHEDULES


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "handler"):
        parser.print_help()
        return 2
    try:
        if getattr(args, "extra", None):
            require_extra(args.extra)
        args.handler(args)
    except TokMemError as err:
        error_console.print(f"[bold red]error:[/bold red] {escape(str(err))}", highlight=False)
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

    adapt = commands.add_parser(
        "adapt", help="the adaptation phase: teach a backbone to read and chain memory tokens, saved as a new backbone",
        description="LoRA (r 8, alpha 32, dropout 0.1 on q, v) trains with temporary memory rows on held-out procedures, "
        "is merged into the backbone and the rows are dropped. Default data: 5,000 queries over the built-in adaptation tools.")
    adapt.add_argument("--backbone", default="smollm2-135m")
    adapt.add_argument("--out", required=True, help="new directory for the adapted backbone (use it as --backbone later)")
    adapt.add_argument("--data", help="procedures JSONL of held-out procedures (default: the built-in adaptation tools)")
    adapt.add_argument("--samples", type=int, default=5000, help="built-in data: queries in all (50 single-tool samples a tool)")
    adapt.add_argument("--epochs", type=int, default=1)
    adapt.add_argument("--lr", type=float, default=5e-5, help="the LoRA weights' learning rate")
    adapt.add_argument("--rows-lr", type=float, default=5e-3, help="the temporary memory rows' learning rate")
    adapt.add_argument("--dropout", type=float, default=0.1, help="LoRA dropout (0 is several times faster on CPU)")
    adapt.add_argument("--batch-size", type=int, default=4)
    adapt.add_argument("--max-length", type=int, default=1024)
    _common(adapt)
    adapt.set_defaults(handler=cmd_adapt)

    run = commands.add_parser("run", help="answer queries with a bank (routing and chaining)")
    run.add_argument("--bank", required=True)
    run.add_argument("queries", nargs="+")
    run.add_argument("--procedure", help="force this procedure (skip routing)")
    run.add_argument("--top-k", type=int, default=3, help="routing candidates to show")
    _decode_options(run)
    _common(run)
    run.set_defaults(handler=cmd_run)

    evaluate = commands.add_parser(
        "eval", help="routing accuracy, exact match and ROUGE-L on a JSONL file; tool, argument and call F1 for tool calls"
    )
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

    data = commands.add_parser("data", help="real tool-calling data").add_subparsers(metavar="ACTION")
    imports = data.add_parser(
        "import", help="turn a NESTFUL, BFCL, xLAM or OpenAI chat-format file into procedures JSONL (one step per call)",
        description="Each usable record becomes an example whose steps are its calls (the tool is the procedure, the "
        "call JSON the response). Malformed records are refused; records that cannot be used are counted as skipped.",
    )
    imports.add_argument("input", metavar="IN", help="the data file; BFCL: a question file (its possible_answer/ "
                         "file beside it) or the bfcl folder (every question file with answers)")
    imports.add_argument("--format", required=True, choices=sorted(IMPORTERS))
    imports.add_argument("--out", required=True, help="procedures JSONL to write")
    imports.add_argument("--catalog", help="also write the called tools' schemas here (JSONL: name, description, "
                         "parameters; tokmem train --catalog reads it)")
    imports.add_argument("--tools", help="NESTFUL: the tools' spec file (default: X-spec.json beside X-data.json)")
    imports.add_argument("--json", metavar="PATH", help="also write the counts as JSON")
    imports.set_defaults(handler=cmd_data_import)
    serve = commands.add_parser("serve", help="an OpenAI-compatible HTTP server for the banks in a directory")
    serve.add_argument("--banks", required=True, metavar="DIR", help="folder of banks: NAME.safetensors + NAME.safetensors.json")
    serve.add_argument("--backbone", default="smollm2-135m")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", help="bearer token that PUT and DELETE /v1/banks/NAME require")
    serve.add_argument("--max-batch", type=int, default=32, help="rows decoded together")
    serve.add_argument("--max-queue", type=int, default=256, help="waiting requests; more get 429")
    serve.add_argument("--max-resident", type=int, default=256, help="banks kept loaded (least recently used leave)")
    serve.add_argument("--max-prompt-tokens", type=int, default=2048)
    serve.add_argument("--max-new-tokens", type=int, default=1024, help="the most a request may ask for")
    serve.add_argument("--max-body-mb", type=float, default=8.0, help="request body limit; larger bodies get 413")
    serve.add_argument("--timeout", type=float, default=120.0, help="seconds per request, queueing included")
    serve.add_argument("--device", help="cpu, cuda, … (default: cuda when available)")
    serve.add_argument("--seed", type=int, default=0, help="seed of the sampler (requests with temperature > 0)")
    serve.set_defaults(handler=cmd_serve, extra="serve")

    bench = commands.add_parser("bench", help="the paper's studies: atomic recall, memory placement")
    studies = bench.add_subparsers(metavar="STUDY")
    _bench_atomic(studies)
    placement.add_parser(studies)
    compositional.add_parser(studies)
    for study in studies.choices.values():
        study.set_defaults(extra="studies")  # plots, and Sentence-BERT for RAG
    return parser


def _bench_atomic(studies) -> None:
    from tokmem.data.sni import QUERIES
    from tokmem.experiments import atomic
    from tokmem.experiments.settings import add_recipe_arguments

    parser = studies.add_parser(
        "atomic", help="atomic recall on SNI: TokMem vs Base, RAG, LoRA, replay, TokMem+DC",
        description="Every SNI task is a procedure. After each checkpoint (the first k tasks in task-id order) every "
        "method answers the test queries of all k tasks: with --schedule joint it has learned them in one shuffled "
        "round (one run per checkpoint), with --schedule sequential one round per task. Writes the JSON (after every "
        "checkpoint), a markdown table and a PNG plot.",
    )
    parser.add_argument("--preset", choices=["cpu", "paper"], default="cpu",
                        help="cpu = the paper's protocol on the 14 SNI files in ../shared/data/sni/tasks, smollm2-135m, "
                        "Base/RAG/LoRA/TokMem (default, 45 min on 2 CPU cores, measured); paper = 1000 tasks × 500/50, "
                        "Qwen2.5-0.5B-Instruct (GPU, full natural-instructions)")
    parser.add_argument("--query", choices=QUERIES,
                        help="the user turn: definition = the task definition, a blank line and the input (the paper's "
                        "protocol, default); input = the input alone (the memory token must carry the instruction)")
    parser.add_argument("--schedule", dest="task_schedule", choices=tuple(atomic.RECIPES),
                        help="joint = one run per checkpoint on all its tasks shuffled together (the reference code; "
                        "default; TokMem lr 1e-3, linear schedule); sequential = tasks arrive one at a time (the paper's "
                        "text; lr 5e-3, constant)")
    parser.add_argument("--tasks-dir", help="folder of SNI task files (natural-instructions/tasks)")
    parser.add_argument("--num-tasks", type=int, help="tasks to load (default: the last checkpoint)")
    parser.add_argument("--train-per-task", type=int, help="training examples per task, at most (cpu 100, paper 500)")
    parser.add_argument("--min-train-per-task", type=int, help="skip a task with fewer training examples (default: --train-per-task)")
    parser.add_argument("--test-per-task", type=int)
    parser.add_argument("--checkpoints", type=int_list, help="numbers of tasks to evaluate after, e.g. 5,10,14")
    parser.add_argument("--methods", type=name_list, help="comma-separated subset of base,rag,lora,replay,tokmem,tokmem-dc")
    parser.add_argument("--backbone")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--max-new-tokens", type=int)
    parser.add_argument("--eval-batch-size", type=int)
    parser.add_argument("--rag-k", type=int, help="demonstrations RAG retrieves (default 2)")
    parser.add_argument("--lora-rank", type=int, help="default 8 (1 with --sample-efficiency)")
    parser.add_argument("--tokmem-lr", type=float, help="learning rate of the memory rows (default 1e-3 joint, 5e-3 sequential)")
    parser.add_argument("--lora-lr", type=float, help="learning rate of LoRA and replay (cpu preset 1e-3, paper 5e-5)")
    add_recipe_arguments(parser)
    parser.add_argument("--sample-efficiency", action="store_true", default=None,
                        help="10 tasks learned as one mixture with 10/20/50/100/200/500 training examples per task")
    parser.add_argument("--budgets", type=int_list, help="training examples per task for --sample-efficiency")
    parser.add_argument("--out-dir", help="where the table, plot and method states go (default: beside --json)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --json: skip its finished checkpoints")
    parser.add_argument("--json", metavar="PATH", required=True, help="the result file (written after every checkpoint)")
    parser.add_argument("--device", help="cpu, cuda, … (default: cuda when available)")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.set_defaults(handler=cmd_bench_atomic)


def _common(parser) -> None:
    parser.add_argument("--json", metavar="PATH", help="also write the numbers as JSON")
    parser.add_argument("--device", help="cpu, cuda, … (default: cuda when available)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def _training_options(parser) -> None:
    parser.add_argument("--catalog", help="JSONL of {name, description, parameters (a tool's JSON schema, optional)} per procedure")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument("--max-steps", type=int)
    parser.add_argument("--checkpoint-every", type=int, default=0, help="save the bank every N optimiser steps")
    parser.add_argument("--init", choices=INITS, default="mean", help="new rows: mean embedding (the paper's text) or orthogonal")
    parser.add_argument("--lr-schedule", dest="schedule", choices=SCHEDULES, default="constant",
                        help="constant lr, or linear warm-up then decay")
    parser.add_argument("--warmup", type=float, default=0.1, help="warm-up fraction of the linear schedule")
    parser.add_argument("--renorm-every-step", action="store_true", help="renormalise the new rows after every step too")
    parser.add_argument("--result-tokens", type=int, default=RESULT_TOKENS,
                        help="a step's tool result in the training sequence is cut to this many tokens (it says so)")
    _common(parser)


def _decode_options(parser) -> None:
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--max-steps", type=int, default=4, help="most memory tokens (segments) per answer")
    parser.add_argument("--threshold", type=float, default=0.5, help="open-set rule: minimum memory mass to route")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--no-schema", dest="schema", action="store_false",
                        help="decode tools' arguments freely, not under the JSON schemas the bank keeps")


def _train_config(args, out_path):
    from tokmem.train import TrainConfig

    return TrainConfig(
        lr=args.lr, weight_decay=args.weight_decay, epochs=args.epochs, batch_size=args.batch_size,
        grad_accum=args.grad_accum, max_length=args.max_length, max_steps=args.max_steps, seed=args.seed,
        renormalize=not getattr(args, "no_renorm", False), renorm_every_step=args.renorm_every_step, init=args.init,
        schedule=args.schedule, warmup=args.warmup, progress=not args.quiet, result_tokens=args.result_tokens,
        checkpoint=str(out_path) if args.checkpoint_every else None, checkpoint_every=args.checkpoint_every,
    )


def _decode_config(args):
    from tokmem.decode import DecodeConfig

    return DecodeConfig(
        max_new_tokens=args.max_new_tokens, max_steps=args.max_steps, threshold=args.threshold,
        temperature=args.temperature, batch_size=args.batch_size, seed=args.seed, schema=args.schema,
    )


def _learn_and_save(model, args, out_path) -> None:
    from tokmem.data import load_catalog, load_examples
    from tokmem.data.procedures import load_schemas
    from tokmem.train import learn

    examples = load_examples(args.data)
    descriptions = load_catalog(args.catalog) if args.catalog else None
    schemas = load_schemas(args.catalog) if args.catalog else None
    report = learn(model, examples, _train_config(args, out_path), descriptions=descriptions, schemas=schemas)
    model.bank.save(out_path)
    summary = report.summary()
    console.print(
        f"learned {len(report.new_procedures)} new procedures ({len(model.bank)} in the bank) from {len(examples)} examples: "
        f"{summary['steps']} steps, {summary['seconds']} s, {summary['tokens_per_s']} tokens/s, final loss {summary['final_loss']:.3f}"
    )
    if report.truncated:
        warning = report.truncated.describe(len(examples), args.max_length)
        console.print(f"[yellow]warning: {warning}; raise --max-length to keep them whole[/yellow]", highlight=False)
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


def cmd_adapt(args) -> None:
    from pathlib import Path

    from tokmem.adapt import AdaptConfig, adapt
    from tokmem.backbones import load_backbone
    from tokmem.data import load_examples
    from tokmem.data.tools import adaptation_examples
    from tokmem.train import TrainConfig

    if Path(args.out).exists():
        raise TokMemError(f"{args.out} already exists: give --out a new directory")
    examples = load_examples(args.data) if args.data else adaptation_examples(args.samples, seed=args.seed)
    rows = TrainConfig(lr=args.rows_lr, epochs=args.epochs, batch_size=args.batch_size, max_length=args.max_length,
                       seed=args.seed, progress=not args.quiet)
    backbone = load_backbone(args.backbone, device=args.device)
    adapted = adapt(backbone, examples, AdaptConfig(lr=args.lr, dropout=args.dropout), rows, save_to=args.out, inplace=True)
    procedures = len({p for e in examples for p in e.procedures})
    console.print(f"adapted {args.backbone} on {len(examples)} queries over {procedures} procedures; saved {adapted.name}")
    console.print(f"use it with --backbone {adapted.name}")
    if args.json:
        write_json(args.json, {"backbone": adapted.name, "base": args.backbone, "examples": len(examples),
                               "procedures": procedures, "fingerprint": adapted.fingerprint(), "machine": machine()})


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
    if result["calls"]:
        console.print(call_scores_table("tool calls (F1, 0–100)", result["calls"]))
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


def _import_nestful(path, tools):
    from tokmem.data.nestful import import_nestful

    return import_nestful(path, tools)


def _import_bfcl(path, tools):
    from tokmem.data.bfcl import import_bfcl

    _no_tools(tools, "bfcl")
    return import_bfcl(path)


def _import_xlam(path, tools):
    from tokmem.data.xlam import import_xlam

    _no_tools(tools, "xlam")
    return import_xlam(path)


def _import_openai(path, tools):
    from tokmem.data.openai_chat import import_openai

    _no_tools(tools, "openai")
    return import_openai(path)


def _no_tools(tools, format_name) -> None:
    if tools is not None:
        raise TokMemError(f"--tools is for --format nestful; {format_name} files carry their tools' schemas")


IMPORTERS = {"nestful": _import_nestful, "bfcl": _import_bfcl, "xlam": _import_xlam, "openai": _import_openai}


def cmd_data_import(args) -> None:
    from tokmem.data.procedures import save_catalog, save_examples

    imported = IMPORTERS[args.format](args.input, args.tools)
    save_examples(imported.examples, args.out)
    if args.catalog:
        save_catalog(imported.catalog.values(), args.catalog)
    histogram = imported.calls_per_example()
    calls = sum(n * count for n, count in histogram.items())
    lines = [
        f"read {imported.records} records from {args.input}",
        f"wrote {len(imported.examples)} examples ({calls} calls) to {args.out}",
        "calls per example: " + ", ".join(f"{n}: {count}" for n, count in histogram.items()),
        f"tools: {len(imported.catalog)}" + (f" (schemas in {args.catalog})" if args.catalog else ""),
        "skipped:" + ("" if imported.skipped else " nothing"),
        *(f"  {count} {reason}" for reason, count in imported.skipped.items()),
    ]
    console.print("\n".join(lines), highlight=False, soft_wrap=True)
    if args.json:
        write_json(args.json, {
            "input": args.input, "format": args.format, "out": args.out, "catalog": args.catalog,
            "records": imported.records, "examples": len(imported.examples), "calls": calls,
            "calls_per_example": histogram, "tools": list(imported.catalog), "skipped": dict(imported.skipped),
        })
def cmd_serve(args) -> None:
    import uvicorn

    from tokmem.backbones import load_backbone
    from tokmem.serve.api import Limits, create_app
    from tokmem.serve.banks import BankRegistry
    from tokmem.serve.engine import Engine

    backbone = load_backbone(args.backbone, device=args.device)
    registry = BankRegistry(backbone, args.banks, max_resident=args.max_resident)
    engine = Engine(backbone, max_batch=args.max_batch, max_queue=args.max_queue, seed=args.seed)
    limits = Limits(max_prompt_tokens=args.max_prompt_tokens, max_new_tokens=args.max_new_tokens,
                    max_body_bytes=int(args.max_body_mb * 2**20), timeout=args.timeout)
    console.print(f"serving {len(registry.names())} banks from {args.banks} on {backbone.name}: http://{args.host}:{args.port}/v1")
    uvicorn.run(create_app(registry, engine, limits, api_key=args.api_key), host=args.host, port=args.port)


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
    for name, schema in bank.tool_schemas().items():
        if schema is not None:
            console.print(f"[bold]{name}[/bold] arguments schema: {json.dumps(schema, ensure_ascii=False)}", highlight=False, soft_wrap=True)
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
