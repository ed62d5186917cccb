"""``tokmem bench``: the paper's studies (atomic recall, compositional tool calling, memory placement)."""

from __future__ import annotations

from dataclasses import fields

from rich.markdown import Markdown

from tokmem.cli.options import int_list, name_list
from tokmem.report import console
from tokmem.studies import compositional, placement


def add_commands(commands) -> None:
    bench = commands.add_parser("bench", help="the paper's studies: atomic recall, memory placement")
    studies = bench.add_subparsers(metavar="STUDY")
    _bench_atomic(studies)
    placement.add_parser(studies)
    compositional.add_parser(studies)
    for study in studies.choices.values():
        study.set_defaults(extra="studies")  # plots, and Sentence-BERT for RAG


def _bench_atomic(studies) -> None:
    from tokmem.data.sni import QUERIES
    from tokmem.studies import atomic
    from tokmem.studies.settings import add_recipe_arguments

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



def cmd_bench_atomic(args) -> None:
    from tokmem.studies import atomic

    options = {f.name: getattr(args, f.name) for f in fields(atomic.AtomicConfig) if f.name != "preset" and hasattr(args, f.name)}
    config = atomic.make_config(args.preset, **options)
    result = atomic.run(config, json_path=args.json, out_dir=args.out_dir, resume=args.resume, progress=not args.quiet)
    study = atomic.EFFICIENCY if config.sample_efficiency else atomic.ATOMIC
    console.print(Markdown(atomic.markdown(result, study)))
    files = atomic.Files(args.json, args.out_dir)
    console.print(f"[dim]wrote {files.json}, {files.markdown}, {files.plot}[/dim]")
