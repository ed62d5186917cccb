"""Measure two structured-decoding backends on ComplexFuncBench tool schemas with the smollm2-135m tokenizer.

For each backend (xgrammar, llguidance): the time to compile each tool's decoding schema, the time per token to
compute the next-token mask and accept the token while walking the gold arguments, and correctness: every gold
call's arguments (compact JSON, as training writes them) must be accepted and may end there; every broken variant
(an unknown key, a required key left out, a wrong type, a value outside an enum) must be refused.

    PYTHONPATH=src python benchmarks/grammar_backends.py --records 60 --json results/grammar_backends.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from importlib.metadata import version
from pathlib import Path

import llguidance
import llguidance.hf
import llguidance.torch
import torch
import xgrammar

from tokmem import load_backbone
from tokmem.backbones import DEFAULT_BACKBONE
from tokmem.data.nestful import load_spec
from tokmem.data.procedures import arguments_json
from tokmem.data.toolfiles import read_records
from tokmem.io import write_text_atomic
from tokmem.schemas import decoding_schema

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "function-calling" / "complexfuncbench"
BITS = torch.arange(32, dtype=torch.int32)


def allowed_tokens(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """A bool (rows, vocab_size) tensor from the backends' packed int32 bitmask (32 tokens a word)."""
    return ((bitmask.unsqueeze(-1) >> BITS) & 1).bool().flatten(1)[:, :vocab_size]


class XGrammar:
    name = "xgrammar"

    def __init__(self, tokenizer, vocab):
        info = xgrammar.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab, stop_token_ids=[tokenizer.eos_token_id]
        )
        self.compiler, self.vocab = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False), vocab

    def compile(self, schema):
        return self.compiler.compile_json_schema(schema, any_whitespace=False, separators=(",", ":"), strict_mode=False)

    def matcher(self, grammar):
        return xgrammar.GrammarMatcher(grammar)

    def fill(self, matcher, bitmask):
        matcher.fill_next_token_bitmask(bitmask, 0)

    def accept(self, matcher, token):
        return matcher.accept_token(token)


class LLGuidance:
    name = "llguidance"

    def __init__(self, tokenizer, vocab):
        self.tokenizer, self.vocab = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab), vocab

    def compile(self, schema):
        return llguidance.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
        )

    def matcher(self, grammar):
        return llguidance.LLMatcher(self.tokenizer, grammar)

    def fill(self, matcher, bitmask):
        llguidance.torch.fill_next_token_bitmask(matcher, bitmask, 0)

    def accept(self, matcher, token):
        return matcher.consume_token(token) and not matcher.is_error()


def broken_variants(arguments: dict, schema: dict) -> dict[str, dict]:
    """Arguments that break the schema in one way each (where the schema makes that way possible)."""
    properties, required = schema["properties"], schema.get("required", [])
    out = {"unknown key": {**arguments, "zz_not_a_parameter": "x"}}
    if required and required[0] in arguments:
        out["required key missing"] = {k: v for k, v in arguments.items() if k != required[0]}
    for key, spec in properties.items():
        if spec.get("type") in ("number", "integer") and "wrong type" not in out:
            out["wrong type"] = {**arguments, key: "not a number"}
        if spec.get("enum") and "outside enum" not in out:
            out["outside enum"] = {**arguments, key: "zz_not_in_enum"}
    return out


def walk(backend, grammar, ids, eos, timings) -> bool:
    """Feed ``ids`` through a fresh matcher, checking each against the mask; True when all pass and EOS may follow."""
    matcher = backend.matcher(grammar)
    bitmask = torch.zeros(1, (backend.vocab + 31) // 32, dtype=torch.int32)
    for token in [*ids, eos]:
        start = time.perf_counter()
        backend.fill(matcher, bitmask)
        allowed = bool(allowed_tokens(bitmask, backend.vocab)[0, token])
        if token != eos and allowed:
            allowed = backend.accept(matcher, token)
        timings.append(time.perf_counter() - start)
        if not allowed:
            return False
    return True


def measure(backend, tokenizer, spec, calls) -> dict:
    compile_s, grammars = [], {}
    for name, entry in spec.items():
        start = time.perf_counter()
        grammars[name] = backend.compile(decoding_schema(entry["parameters"]))
        compile_s.append(time.perf_counter() - start)
    timings, accepted, in_schema_order, refused, failures = [], 0, 0, {}, []
    for name, arguments in calls:
        ids = tokenizer(arguments_json(arguments), add_special_tokens=False)["input_ids"]
        if walk(backend, grammars[name], ids, tokenizer.eos_token_id, timings):
            accepted += 1
        else:
            failures.append({"tool": name, "arguments": arguments})
        ordered = {key: arguments[key] for key in spec[name]["parameters"]["properties"] if key in arguments}
        ids = tokenizer(arguments_json(ordered), add_special_tokens=False)["input_ids"]
        in_schema_order += walk(backend, grammars[name], ids, tokenizer.eos_token_id, [])
        for kind, broken in broken_variants(arguments, spec[name]["parameters"]).items():
            ids = tokenizer(arguments_json(broken), add_special_tokens=False)["input_ids"]
            total, ok = refused.get(kind, (0, 0))
            refused[kind] = (total + 1, ok + int(not walk(backend, grammars[name], ids, tokenizer.eos_token_id, [])))
    per_token_us = sorted(t * 1e6 for t in timings)
    return {
        "version": version(backend.name),
        "schemas": len(spec),
        "compile_ms": {"mean": round(statistics.mean(compile_s) * 1e3, 2), "max": round(max(compile_s) * 1e3, 2)},
        "mask_and_accept_us_per_token": {
            "tokens": len(per_token_us),
            "mean": round(statistics.mean(per_token_us), 1),
            "p50": round(per_token_us[len(per_token_us) // 2], 1),
            "p99": round(per_token_us[int(len(per_token_us) * 0.99)], 1),
        },
        "gold_calls_accepted": f"{accepted}/{len(calls)}",
        "gold_calls_accepted_with_keys_in_schema_order": f"{in_schema_order}/{len(calls)}",
        "broken_calls_refused": {kind: f"{ok}/{total}" for kind, (total, ok) in sorted(refused.items())},
        "gold_failures": failures[:5],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--records", type=int, default=60, help="ComplexFuncBench records (spread over the file) whose calls are walked"
    )
    parser.add_argument("--json", default="results/grammar_backends.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = load_backbone(DEFAULT_BACKBONE, device="cpu").tokenizer
    spec = load_spec(DATA / "complexfuncbench-spec.json.gz")
    records = read_records(DATA / "complexfuncbench-data.json.gz")
    records = records[:: max(1, len(records) // args.records)][
        : args.records
    ]  # spread over the domains (the file is sorted)
    calls = [(c["name"], c["arguments"]) for r in records for c in r["output"] if c["name"] in spec]
    result = {
        "command": f"PYTHONPATH=src python benchmarks/grammar_backends.py --records {args.records}",
        "machine": f"{platform.platform()}, {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), 1 torch thread",
        "tokenizer": DEFAULT_BACKBONE,
        "records": len(records),
        "calls": len(calls),
        "backends": {
            b.name: measure(b, tokenizer, spec, calls)
            for b in (XGrammar(tokenizer, len(tokenizer)), LLGuidance(tokenizer, len(tokenizer)))
        },
    }
    text = json.dumps(result, indent=2, ensure_ascii=False)
    write_text_atomic(args.json, text + "\n")
    print(text)


if __name__ == "__main__":
    main()
