"""What compiling a tool set's argument grammars costs, on ComplexFuncBench's tool schemas and a backbone's tokenizer.

Three ways, in one run on the same schemas (each tool's ``decoding_schema``: bounded strings, references): every
schema compiled as written, one after another (how tokmem compiled before); with its repeated string and integer
leaves shared (``schemas.shared_leaves``), one after another; and shared, side by side (``Grammars.rows``: one
thread a schema, as a bank's rows now compile).  The vocabulary's size drives the cost: Qwen2.5's 151,936 tokens
against smollm2's 49,152.

    PYTHONPATH=src python benchmarks/grammar_compile.py --backbone qwen2.5-coder-0.5b --tools 8 \
        --json results/grammar_compile-qwen0.5b.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import xgrammar

from tokmem import load_backbone
from tokmem.data.nestful import load_spec
from tokmem.decoding.grammar import Grammars
from tokmem.io import write_json_atomic
from tokmem.schemas import decoding_schema, shared_leaves
from tokmem.cli.options import add_backbone

SPEC = (
    Path(__file__).resolve().parents[2] / "shared/data/function-calling/complexfuncbench/complexfuncbench-spec.json.gz"
)


def sequential(compiler, schemas: list[dict]) -> float:
    start = time.perf_counter()
    for schema in schemas:
        compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"), strict_mode=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_backbone(parser)
    parser.add_argument("--tools", type=int, default=8, help="the first N tools of the spec")
    parser.add_argument("--spec", type=Path, default=SPEC)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    backbone = load_backbone(args.backbone)
    tools = list(load_spec(args.spec).values())[: args.tools]
    schemas = [decoding_schema(tool["parameters"]) for tool in tools]
    info = xgrammar.TokenizerInfo.from_huggingface(
        backbone.tokenizer, vocab_size=backbone.vocab_size, stop_token_ids=[backbone.tokenizer.eos_token_id]
    )
    compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    written_out = sequential(compiler, schemas)
    shared = sequential(compiler, [shared_leaves(s) for s in schemas])
    start = time.perf_counter()
    Grammars(backbone.tokenizer, backbone.vocab_size).rows([tool["parameters"] for tool in tools])
    side_by_side = time.perf_counter() - start
    result = {
        "backbone": args.backbone,
        "vocab_size": backbone.vocab_size,
        "tools": len(tools),
        "seconds": {
            "written_out_one_after_another": round(written_out, 2),
            "shared_leaves_one_after_another": round(shared, 2),
            "shared_leaves_side_by_side": round(side_by_side, 2),
        },
        "speedup_shared": round(written_out / shared, 2),
        "speedup_shared_side_by_side": round(written_out / side_by_side, 2),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load": os.getloadavg()[0]},
    }
    print(json.dumps(result, indent=1))
    if args.json:
        write_json_atomic(args.json, result)


if __name__ == "__main__":
    main()
