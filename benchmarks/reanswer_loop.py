"""A kept tool-loop bank answered again, without training: one decoding rule switched at a time.

The bank (a study run's, e.g. ``benchmarks/loop_ab.py``'s ``<json stem>-banks/calls.safetensors``) answers the
ComplexFuncBench tool loop of the study it was trained for (``--preset cpu --dataset complexfuncbench``, the seed
given: the same test records), per step and end to end, scored by position (``eval.tool_loop.loop_scores``), once
as the study answers (a call answered since the user's message may be repeated where a call is due) and once with
``avoid_repeats`` (a turn never repeats a call already answered: ``tokmem.chat_batch``), the rule the server and
``tokmem.chat`` apply under ``tool_choice="auto"``.  The bank and its answers are the one difference.

    OMP_NUM_THREADS=2 python benchmarks/reanswer_loop.py results/loop-ab-qwen0.5b-banks/calls.safetensors \
        --seed 0 --json results/repeats-qwen0.5b.json
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import tokmem
from tokmem.eval.tool_loop import chat_answerer, loop_scores
from tokmem.io import write_json_atomic
from tokmem.report import machine
from tokmem.sequences import RESULT_TOKENS
from tokmem.studies.compositional_config import make_config
from tokmem.studies.harness import progress_bar
from tokmem.studies.tool_setup import tool_data

RULES = {"as the study answers": None, "no repeats": True}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bank")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", required=True)
    parser.add_argument("--rule", action="append", choices=list(RULES), help="answer under these (default: all)")
    args = parser.parse_args()
    model = tokmem.load(args.bank, device="cpu")
    config = make_config("cpu", dataset="complexfuncbench", backbone=model.backbone.name.split("+")[0], seed=args.seed)
    data = tool_data(config, (1, config.tools))
    decode = replace(config.decode(), threshold=0.0)  # the study's TokMem: a call is due at every step
    bar = progress_bar(True)
    result = {"bank": args.bank, "seed": args.seed, "machine": machine(), "rules": {}}
    for label in args.rule or RULES:
        avoid = RULES[label]
        answer = chat_answerer(model, decode, RESULT_TOKENS, avoid_repeats=avoid)
        scores = loop_scores(answer, data.test, config.max_calls, bar, label, memory=True)
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
