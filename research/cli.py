"""The research tree's command line, ``python -m research bench STUDY``: the paper's studies, each a config dataclass
whose fields are its options.

Every study option defaults to None on the command line: an option given overrides the preset's value,
one not given leaves it (or the config's default) alone.
"""

from __future__ import annotations

import argparse
from dataclasses import fields

from rich.markdown import Markdown

from tokmem.cli import run
from tokmem.cli.options import add_options, values
from tokmem.errors import TokMemError
from tokmem.report import console
from research.studies import atomic, atomic_config, atomic_report, compositional, compositional_report
from research.studies import gsm8k_placement, gsm8k_placement_config, gsm8k_placement_report
from research.studies import memorization, memorization_config, memorization_report
from research.studies import compositional_config as composition


def main(argv=None) -> int:
    return run(build_parser(), argv)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m research", description="The paper's studies of TokMem.")
    add_commands(parser.add_subparsers(metavar="COMMAND"))
    return parser


def add_commands(commands) -> None:
    bench = commands.add_parser(
        "bench", help="the paper's studies: atomic recall, compositional tool calling, memory placement"
    )
    studies = bench.add_subparsers(metavar="STUDY")
    add_atomic(studies)
    add_placement(studies)
    add_compositional(studies)
    for study in studies.choices.values():
        study.set_defaults(extra="studies")  # plots, and Sentence-BERT for RAG


def _outputs(parser, what: str) -> None:
    parser.add_argument("--json", metavar="PATH", required=True, help=f"the result file ({what})")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def _written(paths) -> None:
    console.print(f"wrote {', '.join(map(str, paths))}", markup=False, highlight=False)


# ---- atomic ------------------------------------------------------------------------------------------------
def add_atomic(studies) -> None:
    parser = studies.add_parser(
        "atomic",
        help="atomic recall on SNI: TokMem vs Base, RAG, LoRA, replay, TokMem+DC",
        description="Every SNI task is a procedure. After each checkpoint (the first k tasks in task-id order) every "
        "method answers the test queries of all k tasks: with --schedule joint it has learned them in one shuffled "
        "round (one run per checkpoint), with --schedule sequential one round per task. Writes the JSON (after every "
        "checkpoint), a markdown table and a PNG plot.",
    )
    parser.add_argument(
        "--preset",
        choices=tuple(atomic_config.PRESETS),
        default="cpu",
        help="cpu = the paper's protocol on the 14 SNI files of the shared data, smollm2-135m, "
        "Base/RAG/LoRA/TokMem (default); paper = 1000 tasks × 500/50, Qwen2.5-0.5B-Instruct (GPU, full "
        "natural-instructions)",
    )
    add_options(parser, atomic_config.AtomicConfig, unset=True)
    parser.add_argument("--out-dir", help="where the table, plot and method states go (default: beside --json)")
    parser.add_argument(
        "--resume", action="store_true", help="continue the run in --json: skip its finished checkpoints"
    )
    _outputs(parser, "written after every checkpoint")
    parser.set_defaults(handler=cmd_atomic)


def cmd_atomic(args) -> None:
    config = atomic_config.make_config(args.preset, **values(args, atomic_config.AtomicConfig))
    result = atomic.run(config, json_path=args.json, out_dir=args.out_dir, resume=args.resume, progress=not args.quiet)
    study = atomic_report.EFFICIENCY if config.sample_efficiency else atomic_report.ATOMIC
    console.print(Markdown(atomic_report.markdown(result, study)))
    files = atomic.Files(args.json, args.out_dir)
    _written([files.json, files.markdown, files.plot])


# ---- compositional -----------------------------------------------------------------------------------------
def add_compositional(studies) -> None:
    parser = studies.add_parser(
        "compositional",
        help="compositional tool calling: TokMem vs ICL, RAG, fine-tuning (Table 3, generalisation, forgetting)",
    )
    parser.add_argument("--study", choices=tuple(composition.STUDIES), default="main")
    parser.add_argument(
        "--preset",
        choices=tuple(composition.PRESETS),
        default="cpu",
        help="cpu: 10 tools, 220 training and 40 test queries on smollm2-135m (complexfuncbench: 150 and "
        "24 records); paper: the paper's sizes (Llama-3.2-1B-Instruct, 5000/500 queries; 50 + 50 tools "
        "with --xlam), for a GPU",
    )
    add_options(parser, composition.CompositionalConfig, unset=True)
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --json: keep the methods it finished (with --seeds or --epoch-budgets every run "
        "under <json stem>-runs/ is continued or reused without it)",
    )
    _outputs(parser, "saved after every method; .md and .png go beside it")
    parser.set_defaults(handler=cmd_compositional)


def compositional_config(args) -> composition.CompositionalConfig:
    """The study's config: the preset's settings, overridden by every option given on the command line."""
    return composition.make_config(args.preset, args.study, **values(args, composition.CompositionalConfig))


def cmd_compositional(args) -> None:
    written: list = []

    def write(result: dict) -> None:
        written[:] = compositional_report.write_outputs(result, args.json)

    result = compositional.run_all(
        compositional_config(args), progress=not args.quiet, json_path=args.json, write=write, resume=args.resume
    )
    console.print(compositional_report.markdown(result), markup=False, highlight=False, soft_wrap=True)
    _written(written)


# ---- placement ---------------------------------------------------------------------------------------------
PLACEMENT = {"memorization": memorization_config, "gsm8k": gsm8k_placement_config}  # the two placement studies' presets
PLACEMENT_CONFIGS = {
    "memorization": memorization_config.MemorizationConfig,
    "gsm8k": gsm8k_placement_config.GSM8KConfig,
}


def add_placement(studies) -> None:
    parser = studies.add_parser("placement", help="memory placement: TokMem's infix memory vs prefix tuning")
    parser.add_argument("--study", choices=tuple(PLACEMENT), default="memorization")
    parser.add_argument(
        "--preset",
        choices=("cpu", "paper"),
        default="cpu",
        help="cpu: smaller sizes for a CPU; paper: the paper's sizes",
    )
    seen = set()
    for config in PLACEMENT_CONFIGS.values():  # the options of both studies; each names the study it applies to
        add_options(parser, config, skip=seen, unset=True)
        seen |= {f.name for f in fields(config)}
    parser.add_argument(
        "--resume", action="store_true", help="gsm8k: continue the run in --json, skipping its finished runs"
    )
    _outputs(parser, "the markdown table (.md) and plot (.png) go beside it")
    parser.set_defaults(handler=cmd_placement)


def placement_config(args):
    """The preset's config with the options given on the command line; an option of the other study is an error."""
    config = PLACEMENT_CONFIGS[args.study]
    given = {
        name: value for config_type in PLACEMENT_CONFIGS.values() for name, value in values(args, config_type).items()
    }
    foreign = sorted(set(given) - {f.name for f in fields(config)})
    if foreign:
        raise TokMemError(
            f"--{', --'.join(k.replace('_', '-') for k in foreign)} does not apply to --study {args.study}"
        )
    return PLACEMENT[args.study].make_config(args.preset, **given, progress=not args.quiet)


def cmd_placement(args) -> None:
    if args.resume and args.study != "gsm8k":
        raise TokMemError(f"--resume does not apply to --study {args.study}")
    config = placement_config(args)
    if args.study == "gsm8k":
        result, report = gsm8k_placement.run_study(config, args.json, args.resume), gsm8k_placement_report
    else:
        result, report = memorization.run_study(config, args.json), memorization_report
    console.print(report.markdown(result), markup=False, highlight=False, soft_wrap=True)
    _written(report.outputs(args.json))
