"""``tokmem run`` and ``eval``: answer queries with a bank, score it on a data file."""

from __future__ import annotations

from tokmem.cli.options import add_common, add_off_topic, add_options, off_topic_specs, values
from tokmem.decoding.decode import DecodeConfig
from tokmem.report import (
    call_scores_table,
    console,
    machine,
    outcome_lines,
    percent,
    print_fallbacks,
    print_restraints,
    scores_table,
    trace_table,
    write_json,
)


def add_commands(commands) -> None:
    run = commands.add_parser("run", help="answer queries with a bank (routing and chaining)")
    run.add_argument("--bank", required=True)
    run.add_argument("queries", nargs="+")
    run.add_argument("--procedure", help="force this procedure (skip routing)")
    run.add_argument("--top-k", type=int, default=3, help="routing candidates to show")
    _decode_options(run)
    run.set_defaults(handler=cmd_run)

    evaluate = commands.add_parser(
        "eval",
        help="routing accuracy, exact match and ROUGE-L on a JSONL file; tool, argument and call F1 for tool calls",
    )
    evaluate.add_argument("--bank", required=True)
    evaluate.add_argument("--data", required=True, help="procedures JSONL; an example with no steps is off-topic")
    add_off_topic(evaluate)
    _decode_options(evaluate)
    evaluate.set_defaults(handler=cmd_eval)


def _decode_options(parser) -> None:
    # context_contrast: an option of tokmem.chat's alone (generate refuses it), not offered until it earns a place
    add_options(parser, DecodeConfig, skip=("seed", "context_contrast"))
    add_common(parser)


def cmd_run(args) -> None:
    from tokmem.decoding.decode import generate, route
    from tokmem.model import load

    model = load(args.bank, device=args.device)
    routes = route(model, args.queries, k=args.top_k)
    generations = generate(model, args.queries, DecodeConfig(**values(args, DecodeConfig)), procedure=args.procedure)
    results = []
    for r, g in zip(routes, generations):
        candidates = ", ".join(f"{name} {100 * p:.1f}%" for name, p in r.candidates)
        console.print(f"[bold]{g.query}[/bold]\n  routing: {candidates} (memory mass {100 * r.memory_mass:.1f}%)")
        for segment in g.trace:
            console.print(f"  [cyan]{segment.procedure or '(backbone)'}[/cyan] → {segment.text}", highlight=False)
        results.append(
            {
                "query": g.query,
                "routed": g.routed,
                "memory_mass": r.memory_mass,
                "candidates": r.candidates,
                "trace": [{"procedure": s.procedure, "text": s.text} for s in g.trace],
                "text": g.text,
            }
        )
    if args.json:
        write_json(args.json, {"bank": args.bank, "results": results})


def cmd_eval(args) -> None:
    from tokmem.data import load_examples
    from tokmem.eval.evaluate import evaluate
    from tokmem.eval.open_set import restraint, restraints
    from tokmem.model import load

    model = load(args.bank, device=args.device)
    config = DecodeConfig(**values(args, DecodeConfig))
    given = load_examples(args.data, known_procedures=model.bank.names)
    examples = [e for e in given if e.steps]
    off_topic = [e.query for e in given if not e.steps]
    result = evaluate(model, examples, config) if examples else {}
    if examples:
        console.print(scores_table(f"{args.data} ({len(examples)} examples)", result))
        print_fallbacks(
            result["open_set_fallbacks"], len(examples), "held-out queries", "--epochs N (more than before)"
        )
    result["off_topic"] = restraints(model, off_topic_specs(args), config.threshold)
    if off_topic:
        result["off_topic"][args.data] = restraint(model, off_topic, config.threshold)
    print_restraints(result["off_topic"])
    if result.get("calls_per_step"):
        title = "tool calls per step, each answer against its step's gold call, gold calls and results before"
        console.print(call_scores_table(f"{title} (F1 over steps, 0–100)", result["calls_per_step"]))
        console.print("\n".join(outcome_lines(result["step_outcomes"])), highlight=False)
    if result.get("calls"):
        whole = (
            "end to end, each call answered with its recorded result" if result["calls_per_step"] else "whole answers"
        )
        console.print(
            call_scores_table(f"tool calls, {whole}, the k-th against the k-th gold call (F1, 0–100)", result["calls"])
        )
    if result.get("chain_examples"):
        console.print(trace_table("chained examples", [r for r in result["predictions"] if len(r["gold"]) > 1]))
        console.print(f"chain accuracy {percent(result['chain_accuracy'])} over {result['chain_examples']} chains")
    if args.json:
        write_json(args.json, {"bank": args.bank, "data": args.data, **result, "machine": machine()})
