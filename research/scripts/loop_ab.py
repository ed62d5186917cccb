"""Controlled A/Bs of TokMem's recipe in the ComplexFuncBench tool loop: one TokMem (w/o adapt) bank a variant, each
trained as the tool-loop study trains it (``--preset cpu --dataset complexfuncbench``, the seed given) with the
settings the variant names changed, then answering the records of the study's split per step (``--split dev``, the
default, where A/Bs are decided; ``test`` only with the recipe frozen in a ``--preset-file``).  The file's ``config``
names the study (seed, split, preset file and its SHA-256) and the methods its variants ran.

A variant is ``NAME:SETTING=VALUE,...`` over the study's settings (`CompositionalConfig`'s fields; a value is read as
JSON where it parses, else as text): ``calls:key_order=calls`` ``schema:key_order=schema`` (the default pair: the
order a tool's arguments are trained and decoded in, the calls' against the spec's), ``tokens:renorm_every_step=true,
renorm_target=tokens`` (rows renormalised to a token's norm after every step, the reference code's), ``lr5e-3:
tokmem_lr=5e-3`` (the paper's lr), ``dc-steer:decoupled=true,renorm_every_step=true,renorm_target=tokens,
renorm_side=steer`` (a decoupled bank whose steer rows are held at a token's norm, its index rows free),
``shown:show_schemas=true`` (tokmem+schema: the chosen tool's schema between its memory token and its arguments),
``tails:memory_tokens=2`` (two memory tokens a tool: the second, the tail, steers the arguments), ``shared1:
shared_tokens=1`` (a row every tool reads after its memory token, trained on all the tools' calls).  The settings
are the one difference between variants of a file.

Each row has the per-step scores by position (``eval.steps``), the outcomes, the outcomes of the tools whose spec
lists keys out of the calls' order counted apart, and the bank's row norms beside the backbone's token norm.  Each
bank is kept beside the results (``<json stem>-banks/<variant>.safetensors``) to answer again without training
(``reanswer_loop.py``).  Resumable: a variant answered in ``--json`` is not run again; one trained (its updates and
seconds in ``--json``, its bank kept) is answered without training again; a TokMem bank interrupted while training
goes on from its last step (``TrainConfig.resume``); ``--answer-again`` answers the variants named
again from their kept banks (after a decoding fix: each entry says when it was ``answered``).

    OMP_NUM_THREADS=2 python -m research.scripts.loop_ab --seed 0 --backbone qwen2.5-coder-0.5b \
        --json results/key-order-qwen0.5b.json
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import Counter
from dataclasses import fields, replace
from pathlib import Path

import torch

from research.scripts.loop_answers import (
    METHOD,
    reordered_tools,
    variant_config,
)

from tokmem.bank.memory_bank import MemoryBank
from tokmem.cli.options import add_backbone
from tokmem.eval.steps import OUTCOMES, outcome
from tokmem.io import write_json_atomic
from research.methods.tokmem import TokMem
from tokmem.model import TokMemModel
from tokmem.report import machine
from tokmem.training.sequences import RESULT_TOKENS
from research.studies.compositional_config import CompositionalConfig, frozen_settings
from research.studies.harness import learn_round, progress_bar
from research.studies.realtools import SPLITS
from research.studies.tool_loop import loop_scores
from research.studies.tool_setup import build_method, prepare_backbones, tool_data
from tokmem.training.train_state import remove_checkpoint

KEY_ORDERS = ("calls:key_order=calls", "schema:key_order=schema")
STUDY = ("seed", "split", "preset_sha256")  # with the backbone: what every variant of a file shares


def variant(text: str) -> tuple[str, dict]:
    """``NAME:SETTING=VALUE,...`` → (name, settings), each setting a field of the study's config (a value may be a
    JSON list: ``adapt_data=["bfcl","study"]``)."""
    name, _, body = text.partition(":")
    known = {f.name for f in fields(CompositionalConfig)}
    settings = {}
    for item in filter(None, re.split(r",(?=\w+=)", body)):
        key, equals, value = item.partition("=")
        if not equals or key not in known:
            raise argparse.ArgumentTypeError(f"variant '{text}': '{item}' is not SETTING=VALUE of a study setting")
        try:
            settings[key] = json.loads(value)
        except json.JSONDecodeError:
            settings[key] = value
    if not name:
        raise argparse.ArgumentTypeError(f"variant '{text}' has no name (NAME:SETTING=VALUE,...)")
    return name, settings


def per_step(method, data, reordered: set[str], bar) -> dict:
    """Per step, by position (``studies.tool_loop.loop_scores`` without the end-to-end loop): the scores, the
    outcomes, the outcomes of the ``reordered`` tools' steps apart, the prompt tokens the backbone read a call and
    every record's answers."""
    start = time.perf_counter()
    scored = loop_scores(method, data.test, 0, RESULT_TOKENS, bar, end_to_end=False)  # 0: no end-to-end calls
    seconds = time.perf_counter() - start
    return scored | {
        "outcomes of the reordered tools": group_outcomes(scored["samples"], reordered),
        "seconds": round(seconds, 1),
    }


def group_outcomes(samples: list[dict], tools: set[str]) -> dict[str, int]:
    """The per-step outcomes (``steps.outcome``) of the steps whose gold call is one of ``tools``."""
    counted = Counter(
        outcome(gold, answer, s["gold"][:k])
        for s in samples
        for k, (gold, answer) in enumerate(zip(s["gold"], s["step"]))
        if json.loads(gold)["name"] in tools
    )
    return {kind: counted[kind] for kind in OUTCOMES}


def add_study(parser) -> None:
    """The options naming the study every variant of a file changes: its seed, backbone, split and preset file."""
    parser.add_argument("--seed", type=int, default=0)
    add_backbone(parser)
    parser.add_argument(
        "--split", choices=SPLITS, default="dev", help="the records answered: dev (default), or test with --preset-file"
    )
    parser.add_argument("--preset-file", help="the study's settings frozen in a file: a test run's recipe")


def file_config(args, variants: dict) -> dict:
    """What a result file records of the study every variant changes (``loop_answers.variant_config`` rebuilds it)
    and the methods its ``variants`` ran (each `METHOD` unless its settings name another)."""
    methods = dict.fromkeys(m for entry in variants.values() for m in entry["settings"].get("methods", [METHOD]))
    config = {"preset": "cpu", "dataset": "complexfuncbench", "methods": list(methods)}
    config |= {"seed": args.seed, "split": args.split}
    if args.preset_file:
        config |= {
            "preset_file": args.preset_file,
            "preset_sha256": frozen_settings(args.preset_file, {})["preset_sha256"],
        }
    return config


def opened(args) -> dict:
    """The result file ``args.json`` ({} when there is none), refused when its variants answered another study (a
    seed, split, preset file or backbone other than ``args``'): their answers would not pair with the new ones."""
    path = Path(args.json)
    if not path.is_file():
        return {}
    result = json.loads(path.read_text())
    was = {key: result["config"].get(key) for key in STUDY} | {"backbone": result["backbone"]}
    now = {key: file_config(args, {}).get(key) for key in STUDY} | {"backbone": args.backbone}
    changed = {key: was[key] for key in was if was[key] != now[key]}
    if changed:
        raise SystemExit(
            f"{path} answered another study ({', '.join(f'{k} {v}' for k, v in changed.items())}; a file from before "
            "the dev/test splits has split None): pass its options or choose another --json"
        )
    return result


def study(settings: dict, args):
    """The study's data and the method ``settings`` make of it (untrained), and its backbone's adaptation."""
    config = variant_config(file_config(args, {}), args.backbone, settings).resolved()
    torch.manual_seed(config.seed)
    data = tool_data(config, (1, config.tools))
    backbones, adaptation = prepare_backbones(config, None, progress=True)
    return data, build_method(config.methods[0], config, backbones, data.tools), adaptation


def kept_path(args, name: str) -> Path:
    """Where a variant's bank (or LoRA adapter) is kept: ``<json stem>-banks/<name>``."""
    return Path(args.json).with_name(f"{Path(args.json).stem}-banks") / name


def answered(method, data, settings: dict, bar) -> dict:
    """``per_step``'s answers with the settings, the rows' norms and when."""
    reordered = reordered_tools(data.tools, data.train)
    token = {"token": round(method.model.backbone.embedding_norm(), 6)}
    norms = {"row_norms": row_norms(method.model.bank) | token} if isinstance(method, TokMem) else {}
    return {
        "settings": settings,
        "method": method.name,
        **norms,
        "tools_whose_order_differs": sorted(reordered),
        "answered": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        **per_step(method, data, reordered, bar),
    }


def run_variant(name: str, settings: dict, args, found: dict, save) -> dict:
    """One bank trained with ``settings`` (unless ``found`` says it was and its bank is kept) and answered;
    ``save(entry)`` keeps the entry once trained."""
    data, method, adaptation = study(settings, args)
    kept = kept_path(args, name)
    if "train_seconds" in found and restore(method, kept):
        entry = found
    else:
        checkpoint = resumable(method, kept)
        seconds = learn_round(method, data.train, f"{len(data.train)} queries ({name})", args.bar)
        keep(method, kept)
        drop_checkpoint(checkpoint)
        entry = {"settings": settings, "updates": method.updates, "train_seconds": round(seconds, 1)}
        entry |= {"learn_report": method.learn_report} if method.learn_report else {}
        entry |= {"adaptation": adaptation} if adaptation else {}
        save(entry)
    return entry | answered(method, data, settings, args.bar)


def resumable(method, kept: Path) -> Path | None:
    """A TokMem bank's training checkpointed after every step beside ``kept`` (``<kept>-checkpoint.safetensors``)
    and resumed from there when a run was interrupted; the checkpoint's path (None for other methods)."""
    if not isinstance(method, TokMem):
        return None
    checkpoint = kept.with_name(f"{kept.name}-checkpoint.safetensors")
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    method.train_config = replace(method.train_config, checkpoint=str(checkpoint), checkpoint_every=1, resume=True)
    return checkpoint


def drop_checkpoint(checkpoint: Path | None) -> None:
    """Remove what ``resumable`` checkpointed (the bank file pair and its training state) once the bank is kept."""
    if checkpoint:
        remove_checkpoint(checkpoint)


def keep(method, kept: Path) -> None:
    """Keep what ``method`` learned beside the results: a TokMem bank as ``<kept>.safetensors`` (what
    ``reanswer_loop.py`` reads), another method's state (LoRA's adapter) in the folder ``kept``."""
    if isinstance(method, TokMem):
        method.model.bank.save(kept.parent / f"{kept.name}.safetensors")
    else:
        kept.mkdir(parents=True, exist_ok=True)
        method.save(kept)


def restore(method, kept: Path) -> bool:
    """Load what ``keep`` kept into ``method``; False when nothing is kept."""
    if isinstance(method, TokMem):
        bank = kept.parent / f"{kept.name}.safetensors"
        if bank.is_file():
            backbone = method.model.backbone
            method.model = TokMemModel(backbone, MemoryBank.load(bank, backbone=backbone))
        return bank.is_file()
    return method.load(kept)


def row_norms(bank: MemoryBank) -> dict:
    """The rows' mean, least and largest L2 norm (the index side), and a decoupled bank's steer side apart."""
    sides = {"": bank.norms("index")} | ({"steer ": bank.norms("steer")} if bank.decoupled else {})
    return {
        f"{prefix}{stat}": round(float(getattr(norms, stat)()), 6)
        for prefix, norms in sides.items()
        for stat in ("mean", "min", "max")
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_study(parser)
    parser.add_argument(
        "--variant",
        type=variant,
        action="append",
        help=f"NAME:SETTING=VALUE,... (repeat; default: {' '.join(KEY_ORDERS)})",
    )
    parser.add_argument("--json", required=True)
    parser.add_argument(
        "--answer-again",
        action="store_true",
        help="answer again the variants already answered whose bank is kept (after a decoding fix), no training",
    )
    args = parser.parse_args()
    variants = dict(args.variant or map(variant, KEY_ORDERS))
    path = Path(args.json)
    result = opened(args)
    frozen = f" --preset-file {args.preset_file}" if args.preset_file else ""
    result |= {
        "command": f"python -m research.scripts.loop_ab --seed {args.seed} --backbone {args.backbone} --split {args.split}"
        + frozen,
        "backbone": args.backbone,
        "machine": machine(),
    }
    args.bar = progress_bar(True)
    rows = result.setdefault("variants", {})
    for name, settings in variants.items():
        if name in rows and rows[name].get("settings", settings) != settings:
            parser.error(f"{path}: variant '{name}' was run with {rows[name]['settings']}, not {settings}")

        def save(entry: dict, name=name) -> None:
            rows[name] = entry
            result["config"] = file_config(args, rows)
            write_json_atomic(path, result)

        if "step" not in rows.get(name, {}) or args.answer_again:
            save(run_variant(name, settings, args, rows.get(name, {}), save))
        found = rows[name]
        print(
            f"{name} {settings}: exact steps {found['step']['exact_steps']['all']} of {found['step']['steps']['all']}, "
            f"call F1 {found['step']['call_f1']['all']:.1f}; reordered tools' outcomes "
            f"{found['outcomes of the reordered tools']}"
        )
    args.bar.close()


if __name__ == "__main__":
    main()
