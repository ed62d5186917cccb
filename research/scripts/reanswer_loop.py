"""A kept tool-loop bank answered again, without training: one decoding rule switched at a time.

The bank (a study run's, e.g. ``research/scripts/loop_ab.py``'s ``<json stem>-banks/calls.safetensors``) answers the
ComplexFuncBench tool loop of the study it was trained for (``--preset cpu --dataset complexfuncbench``, the seed
given), on the records of ``--split`` (dev, the default, or test: the same records at every seed) or of any
ComplexFuncBench records file (``--test-data FILE``, its spec beside it or ``--test-spec``), per step and end to end, scored by position (``eval.tool_loop.loop_scores``), once
as the study answers (a call answered since the user's message may be repeated where a call is due) and once with
``avoid_repeats`` (a turn never repeats a call already answered: ``tokmem.chat_batch``), the rule the server and
``tokmem.chat`` apply under ``tool_choice="auto"``, and on request ``free arguments``: the arguments decoded without
their tool's grammar (``DecodeConfig.schema`` off: the keys the rows choose, unconstrained); ``--context-contrast A``
adds a rule: the arguments decoded with context-aware decoding of strength A (``DecodeConfig.context_contrast``).
The bank and its answers are the one difference.  ``--step-only``: per step only (the outcomes too), no end-to-end
run.

A kept LoRA adapter (a study run's ``<json stem>-banks/lora.lora/``, with its ``adapter.json``) answers the same
records on the backbone it names (its fingerprint checked) under ``ADAPTER_RULES``: ``free`` (as the study answers
it) and ``schema-bound`` (``research.methods.call_grammar``: TokMem's decoding aids, a call forced where one is due and
written under its tool's schema fitted to the seed's training calls and their key sets).

    OMP_NUM_THREADS=2 python -m research.scripts.reanswer_loop results/loop-ab-qwen0.5b-banks/calls.safetensors \
        --seed 0 --json results/repeats-qwen0.5b.json
    OMP_NUM_THREADS=2 python -m research.scripts.reanswer_loop results/tails-smollm2-banks/chains.safetensors \
        --seed 0 --step-only --context-contrast 0.5 --context-contrast 1 --json results/contrast-smollm2.json
    OMP_NUM_THREADS=2 python -m research.scripts.reanswer_loop results/dev/lora-r8-s0-banks/lora.lora \
        --seed 0 --rule schema-bound --json results/dev/lora-r8-s0-schema.json
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import tokmem
from tokmem.backbones import load_backbone
from tokmem.eval.tool_loop import chat_answerer, loop_scores
from tokmem.io import read_json, write_json_atomic
from tokmem.training.lora import LoRASettings
from research.methods.call_grammar import compile_calls
from research.methods.lora import LoRA
from research.studies.tool_loop import loop_scores as method_scores
from tokmem.report import machine
from tokmem.training.sequences import RESULT_TOKENS
from research.studies.compositional_config import make_config
from research.studies.harness import progress_bar
from research.studies.realtools import SPLITS
from research.studies.tool_setup import tool_data

# each rule: ``avoid_repeats`` (chat_answerer's option) and any DecodeConfig field the study's decoding changes
RULES = {"as the study answers": {}, "no repeats": {"avoid_repeats": True}, "free arguments": {"schema": False}}
DEFAULT_RULES = ("as the study answers", "no repeats")
ADAPTER_RULES = ("free", "schema-bound")  # a kept LoRA adapter's: its calls free, or under call_grammar


def kept_lora(directory: Path, config) -> LoRA:
    """The LoRA method a study run kept in ``directory`` (``compositional.keep_adapter``) on its backbone, answering
    as the study's LoRA does."""
    kept = read_json(directory / "adapter.json")
    backbone = load_backbone(kept["backbone"]["name"], device="cpu")
    if backbone.fingerprint() != kept["backbone"]["fingerprint"]:
        raise SystemExit(f"{directory}: the adapter was trained on another '{kept['backbone']['name']}'")
    settings = LoRASettings(**kept["lora"] | {"target_modules": tuple(kept["lora"]["target_modules"])})
    method = LoRA(backbone, config.train(), settings, config.decode())
    if not method.adapter.load(directory):
        raise SystemExit(f"{directory}: no adapter weights")
    return method


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bank", help="a kept bank (.safetensors) or a kept LoRA adapter (a .lora directory)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", choices=SPLITS, default="dev", help="the records answered (default dev)")
    parser.add_argument("--test-data", help="a ComplexFuncBench (NESTFUL) records file answered in place of a split")
    parser.add_argument("--test-spec", help="the tool schemas of --test-data (default: X-spec.json beside X-data.json)")
    parser.add_argument("--json", required=True)
    parser.add_argument(
        "--rule",
        action="append",
        choices=[*RULES, *ADAPTER_RULES],
        help=f"answer under these (a bank's default: {', '.join(DEFAULT_RULES)}, unless contrasts; an adapter's: "
        f"{', '.join(ADAPTER_RULES)})",
    )
    parser.add_argument(
        "--context-contrast", type=float, action="append", default=[], metavar="A", help="answer with contrast A too"
    )
    parser.add_argument("--step-only", action="store_true", help="answer per step only, no end-to-end run")
    args = parser.parse_args()
    adapter = Path(args.bank).is_dir()
    if adapter and not (Path(args.bank) / "adapter.json").is_file():
        parser.error(
            f"{args.bank}: not a kept LoRA adapter (no adapter.json; a study run keeps <stem>-banks/lora.lora)"
        )
    if adapter and (args.context_contrast or not set(args.rule or ADAPTER_RULES) <= set(ADAPTER_RULES)):
        parser.error(f"an adapter answers under {', '.join(ADAPTER_RULES)} only")
    if not adapter and set(args.rule or ()) & set(ADAPTER_RULES):
        parser.error(f"{', '.join(ADAPTER_RULES)}: rules of a kept LoRA adapter, not of a bank")
    split = "test" if args.test_data else args.split  # a records file stands in for the test split
    records = dict(split=split, test_data=args.test_data, test_spec=args.test_spec)
    if adapter:
        backbone = read_json(Path(args.bank) / "adapter.json")["backbone"]["name"]
        rules = {label: {} for label in args.rule or ADAPTER_RULES}
    else:
        model = tokmem.load(args.bank, device="cpu")
        backbone = model.backbone.name.split("+")[0]
        rules = {label: RULES[label] for label in args.rule or ([] if args.context_contrast else DEFAULT_RULES)}
        rules |= {f"context contrast {a:g}": {"context_contrast": a} for a in args.context_contrast}
    config = make_config("cpu", dataset="complexfuncbench", backbone=backbone, seed=args.seed, **records)
    data = tool_data(config, (1, config.tools))
    if adapter:  # the schema-bound rule's grammar: the tools' schemas fitted to this seed's training calls
        method = kept_lora(Path(args.bank), config)
        schemas = {name: tool.get("parameters") for name, tool in data.tools.items()}
        bound = compile_calls(method.backbone, schemas, data.train)
    decode = replace(config.decode(), threshold=0.0)  # the study's TokMem: a call is due at every step
    bar = progress_bar(True)
    answered = {"bank": args.bank, "seed": args.seed, "split": split, "test_data": args.test_data}
    result = answered | {"machine": machine(), "rules": {}}
    if Path(args.json).is_file():  # resumable: the rules answered for this bank and these records are kept
        found = json.loads(Path(args.json).read_text())
        if (were := {key: found.get(key) for key in answered}) != answered:
            parser.error(f"{args.json} holds the answers of {were}: choose another file")
        result["rules"] = found["rules"]
    for label, rule in rules.items():
        if label in result["rules"]:
            continue
        if adapter:
            method.call_grammar = bound if label == "schema-bound" else None
            scores = method_scores(method, data.test, config.max_calls, RESULT_TOKENS, bar, not args.step_only)
        else:
            changes = {key: value for key, value in rule.items() if key != "avoid_repeats"}
            answer = chat_answerer(model, replace(decode, **changes), RESULT_TOKENS, rule.get("avoid_repeats"))
            scores = loop_scores(answer, data.test, config.max_calls, bar, label, True, end_to_end=not args.step_only)
        result["rules"][label] = scores
        write_json_atomic(args.json, result)
        step = scores["step"]
        print(
            f"{label}: exact steps {step['exact_steps']['all']} of {step['steps']['all']}, "
            f"call F1 {step['call_f1']['all']:.1f}; outcomes {scores['outcomes']['steps']}"
        )
    bar.close()


if __name__ == "__main__":
    main()
