"""Key-set rows on a kept tool-loop bank, answered without training the bank again: the A/B of ``key_sets``.

``loop_ab.py`` keeps each variant's bank (``<json stem>-banks/<variant>.safetensors``); this reads the states its
training records reach (one pass of the backbone, ``tokmem.refit.routing_states``), fits its key-set rows
(``tokmem.key_sets``, what ``TrainConfig.key_sets`` does after training), keeps that bank as
``<variant>+key-sets.safetensors`` and answers the records of the file's split per step as ``loop_ab.py`` does, into
the same file under ``<variant>+key-sets``.  The two entries differ by the key-set rows alone: the same rows, seed, records
and scorer.  Resumable as ``loop_ab.py`` is (a kept bank is answered without fitting again); its seed, backbone, split
and preset file are the file's (``loop_ab.opened`` refuses others).

    OMP_NUM_THREADS=2 python -m research.scripts.fit_key_sets --seed 1 --backbone qwen2.5-coder-0.5b \
        --json results/keysets-qwen0.5b-s1.json --variant shared1-refit
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from research.scripts.loop_ab import (
    add_study,
    answered,
    file_config,
    keep,
    kept_path,
    opened,
    restore,
    study,
)

from tokmem.io import write_json_atomic
from tokmem.training.refit import fit_model_key_sets, routing_states
from research.studies.harness import progress_bar
from tokmem.training.train import encode_examples

SUFFIX = "+key-sets"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_study(parser)
    parser.add_argument("--json", required=True, help="loop_ab.py's result file, the variant answered in it")
    parser.add_argument("--variant", required=True, help="the variant whose kept bank gets key-set rows")
    args = parser.parse_args()
    path = Path(args.json)
    result = opened(args)
    if args.variant not in result.get("variants", {}):
        parser.error(f"{path} holds no variant '{args.variant}'")
    trained = result["variants"][args.variant]
    name, settings = args.variant + SUFFIX, trained["settings"] | {"key_sets": True}
    data, method, _ = study(trained["settings"], args)
    if not restore(method, kept_path(args, name)):
        if not restore(method, kept_path(args, args.variant)):
            parser.error(f"no kept bank of '{args.variant}' beside {path}")
        start = time.perf_counter()
        encoded = encode_examples(method.model, data.train, method.train_config)
        found = routing_states(method.model, encoded, method.train_config.batch_size)
        rows = torch.arange(len(method.model.bank))  # a kept bank's rows are all frozen: every one is this round's
        report = fit_model_key_sets(method.model, found, encoded, rows)
        report["seconds"] = round(time.perf_counter() - start, 1)
        keep(method, kept_path(args, name))
        result["variants"][name] = {"from": args.variant, "settings": settings, "key_sets": report}
        write_json_atomic(path, result)
    bar = progress_bar(True)
    entry = result["variants"][name]
    entry |= {key: trained[key] for key in ("updates", "train_seconds", "learn_report", "adaptation") if key in trained}
    result["variants"][name] = entry | answered(method, data, settings, bar)
    result["config"] = file_config(args, result["variants"])
    write_json_atomic(path, result)
    bar.close()
    step = result["variants"][name]["step"]
    print(
        f"{name}: exact steps {step['exact_steps']['all']} of {step['steps']['all']}, call F1 {step['call_f1']['all']:.1f}"
    )


if __name__ == "__main__":
    main()
