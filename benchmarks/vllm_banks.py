"""What serving TokMem banks through vLLM costs: decode throughput of vLLM plain, vLLM + TokMem with 1 / 100 /
1,000 banks in the batch, vLLM multi-LoRA with 1 / 10 / 100 adapters, and ``tokmem serve``'s engine.

Every configuration decodes the same ``--batch`` prompts (request ``j`` uses bank or adapter ``j mod k``)
to ``--tokens`` tokens each (``ignore_eos``: equal output lengths), greedily.  Decode tokens/s is
``batch × (tokens − 1)`` over the time of that run minus the time of the same batch with one output token
(prefill, scheduling and bank placement taken out), medians of three, after a warm-up pass; prefix caching off.  Banks have ``--rows`` random
rows each (threshold 0, so every answer starts with a memory token); LoRA adapters are random rank-8 on
q_proj and v_proj.  Parity: the greedy answers of the first ``--parity`` requests of the 1,000-bank run,
up to EOS, equal ``tokmem.generate``'s on the same backbone and bank.

Runs in the vLLM environment (``make bench-vllm``):

    .venv-vllm/bin/python benchmarks/vllm_banks.py --json runs/vllm_banks.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

import tokmem
from tokmem.backbones import DEFAULT_BACKBONE, cache_dir, load_backbone
from tokmem.decoding.decode import DecodeConfig, to_generation
from tokmem.training.sequences import chat_prefix
from tokmem.report import console, machine, write_json
from tokmem.serve.banks import BankRegistry
from tokmem.serve.engine import Engine, Request
from tokmem.vllm import engine_args, prompt, sampling_params

BANK_POOLS = (1, 100, 1000)
ADAPTER_POOLS = (1, 10, 100)
LORA_RANK = 8


def write_banks(backbone, directory: Path, count: int, rows: int) -> list[Path]:
    """``count`` banks of ``rows`` rows, each its own random rows around the mean embedding."""
    model = tokmem.create(backbone)
    model.bank.add([f"p{i}" for i in range(rows)], backbone.mean_embedding())
    generator = torch.Generator().manual_seed(0)
    paths = []
    for i in range(count):
        model.bank.index = backbone.mean_embedding() * (
            1 + torch.randn(rows, backbone.hidden_size, generator=generator)
        )
        paths.append(model.bank.save(directory / f"bank{i}.safetensors"))
    return paths


def write_adapters(config, directory: Path, count: int) -> list[Path]:
    """``count`` PEFT LoRA adapters (rank 8, q_proj and v_proj of every layer), random B so that they act."""
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    shapes = {"q_proj": heads * head_dim, "v_proj": kv_heads * head_dim}
    generator = torch.Generator().manual_seed(1)
    paths = []
    for i in range(count):
        path = directory / f"adapter{i}"
        path.mkdir()
        tensors = {}
        for layer in range(config.num_hidden_layers):
            for module, out in shapes.items():
                prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
                tensors[f"{prefix}.lora_A.weight"] = 0.01 * torch.randn(
                    LORA_RANK, config.hidden_size, generator=generator
                )
                tensors[f"{prefix}.lora_B.weight"] = 0.01 * torch.randn(out, LORA_RANK, generator=generator)
        save_file(tensors, path / "adapter_model.safetensors")
        (path / "adapter_config.json").write_text(
            json.dumps(
                {
                    "peft_type": "LORA",
                    "task_type": "CAUSAL_LM",
                    "r": LORA_RANK,
                    "lora_alpha": 2 * LORA_RANK,
                    "target_modules": list(shapes),
                    "lora_dropout": 0.0,
                    "bias": "none",
                    "fan_in_fan_out": False,
                }
            )
        )
        paths.append(path)
    return paths


def timed(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def decode_rate(generate, batch: int, tokens: int, repeats: int = 3) -> float:
    """Decode tokens/s of ``generate(max_tokens)`` over the batch: the full run minus a one-token run
    (medians of ``repeats``)."""
    generate(1)  # warm-up: banks placed, adapters loaded, kernels touched
    one = statistics.median(timed(lambda: generate(1)) for _ in range(repeats))
    full = statistics.median(timed(lambda: generate(tokens)) for _ in range(repeats))
    return batch * (tokens - 1) / (full - one)


def start_llm(model_dir: Path, **options):
    from vllm import LLM

    return LLM(
        model=str(model_dir),
        dtype="float32",
        enforce_eager=True,
        seed=0,
        max_model_len=512,
        enable_prefix_caching=False,
        **options,
    )  # every run prefills: equal work across configurations


def stop_llm(llm) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def measure_plain(model_dir, prompts, args) -> float:
    from vllm import SamplingParams

    llm = start_llm(model_dir, max_num_seqs=args.batch)
    try:
        return decode_rate(
            lambda n: llm.generate(
                prompts, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True), use_tqdm=False
            ),
            len(prompts),
            args.tokens,
        )
    finally:
        stop_llm(llm)


def measure_tokmem(model_dir, prompts, banks, tokenizer, queries, args) -> tuple[dict, list]:
    """Tokens/s per bank pool, and the 1,000-bank run's outputs (for parity)."""
    llm = start_llm(model_dir, max_num_seqs=args.batch, **engine_args(slots=args.rows * max(BANK_POOLS)))
    rates, outputs = {}, []
    try:
        for pool in BANK_POOLS:
            chosen = [banks[j % pool] for j in range(len(prompts))]
            requests = [prompt(tokenizer, q, bank) for q, bank in zip(queries, chosen)]

            def generate(n, chosen=chosen, requests=requests):
                params = [sampling_params(bank, threshold=0.0, max_tokens=n, ignore_eos=True) for bank in chosen]
                return llm.generate(requests, params, use_tqdm=False)

            rates[str(pool)] = decode_rate(generate, len(prompts), args.tokens)
            console.print(f"vLLM + TokMem, {pool} banks: {rates[str(pool)]:.0f} tokens/s")
        outputs = generate(args.tokens)[: args.parity]
        placements = llm.collective_rpc("tokmem_placements")[0]
    finally:
        stop_llm(llm)
    return rates, [(o, placements[str(Path(b).resolve())]["offset"]) for o, b in zip(outputs, chosen)]


def measure_lora(model_dir, prompts, adapters, args) -> dict:
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest

    llm = start_llm(
        model_dir,
        max_num_seqs=args.batch,
        enable_lora=True,
        max_loras=max(ADAPTER_POOLS),
        max_cpu_loras=max(ADAPTER_POOLS),
        max_lora_rank=LORA_RANK,
    )
    rates = {}
    try:
        for pool in ADAPTER_POOLS:
            loras = [
                LoRARequest(f"adapter{j % pool}", j % pool + 1, str(adapters[j % pool])) for j in range(len(prompts))
            ]
            rates[str(pool)] = decode_rate(
                lambda n, loras=loras: llm.generate(
                    prompts,
                    SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True),
                    lora_request=loras,
                    use_tqdm=False,
                ),
                len(prompts),
                args.tokens,
            )
            console.print(f"vLLM multi-LoRA, {pool} adapters: {rates[str(pool)]:.0f} tokens/s")
    finally:
        stop_llm(llm)
    return rates


def measure_tokmem_serve(backbone, bank_dir, token_prompts, queries, args) -> float:
    """``tokmem serve``'s engine on the same rows, requests spread over the largest bank pool."""
    registry = BankRegistry(backbone, bank_dir, max_resident=max(BANK_POOLS))
    engine = Engine(backbone, max_batch=args.batch, max_queue=args.batch)

    def generate(n):
        handles = [
            engine.submit(
                Request(registry.get(f"bank{j % max(BANK_POOLS)}"), p, q, max_tokens=n, ignore_eos=True, threshold=0.0)
            )
            for j, (p, q) in enumerate(zip(token_prompts, queries))
        ]
        while engine.step():
            pass
        return handles

    return decode_rate(generate, len(token_prompts), args.tokens)


def parity(backbone, banks, queries, outputs) -> bool:
    """Whether the vLLM answers, up to EOS, equal ``tokmem.generate``'s (traces: procedures and text)."""
    vocab, eos = backbone.vocab_size, backbone.eos_token_id
    same = True
    for j, (output, offset) in enumerate(outputs):
        ids = list(output.outputs[0].token_ids)
        ids = ids[: ids.index(eos)] if eos in ids else ids
        model = tokmem.load(banks[j % max(BANK_POOLS)], backbone)
        served = to_generation(
            model, queries[j], [t - offset if t >= vocab else t for t in ids], 0.0, routed=ids[0] >= vocab
        )
        expected = tokmem.generate(
            model, [queries[j]], DecodeConfig(max_new_tokens=len(output.outputs[0].token_ids), threshold=0.0)
        )[0]
        same &= served.trace == expected.trace
    return bool(same)


def model_directory(backbone, spec: str, scratch: Path) -> Path:
    """A Hugging Face directory vLLM can load: smollm2's converted cache, or the backbone saved."""
    if spec == DEFAULT_BACKBONE:
        return cache_dir() / "backbones" / "smollm2-135m-instruct-q4_1"
    directory = scratch / "model"
    backbone.model.save_pretrained(directory)
    backbone.tokenizer.save_pretrained(directory)
    return directory


def run(args) -> dict:
    backbone = load_backbone(args.backbone, device="cpu")
    queries = [f"Question {j}: what comes after {j}?" for j in range(args.batch)]
    token_prompts = [chat_prefix(backbone.tokenizer, q) for q in queries]
    prompts = [{"prompt_token_ids": p} for p in token_prompts]
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        (scratch / "banks").mkdir()
        (scratch / "adapters").mkdir()
        model_dir = model_directory(backbone, args.backbone, scratch)
        banks = write_banks(backbone, scratch / "banks", max(BANK_POOLS), args.rows)
        result = {"backbone": args.backbone, "batch": args.batch, "tokens": args.tokens, "rows_per_bank": args.rows}
        result["plain_tokens_per_s"] = measure_plain(model_dir, prompts, args)
        console.print(f"vLLM plain: {result['plain_tokens_per_s']:.0f} tokens/s")
        result["tokmem_tokens_per_s"], outputs = measure_tokmem(
            model_dir, prompts, banks, backbone.tokenizer, queries, args
        )
        result["parity"] = parity(backbone, banks, queries, outputs)
        result["parity_requests"] = len(outputs)
        result["lora_tokens_per_s"] = lora_or_reason(model_dir, prompts, scratch, args)
        result["tokmem_serve_tokens_per_s"] = measure_tokmem_serve(
            backbone, scratch / "banks", token_prompts, queries, args
        )
    result["machine"] = machine()
    result["vllm"] = __import__("vllm").__version__
    return result


def lora_or_reason(model_dir, prompts, scratch, args) -> dict:
    """Multi-LoRA tokens/s per adapter pool, or why vLLM could not run it here (recorded, not faked)."""
    from transformers import AutoConfig

    adapters = write_adapters(AutoConfig.from_pretrained(model_dir), scratch / "adapters", max(ADAPTER_POOLS))
    try:
        return measure_lora(model_dir, prompts, adapters, args)
    except Exception as err:  # noqa: BLE001 - the reason goes into the results
        console.print(f"[red]vLLM multi-LoRA did not run: {err}[/red]")
        return {str(pool): None for pool in ADAPTER_POOLS} | {"error": f"{type(err).__name__}: {err}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--backbone",
        default=DEFAULT_BACKBONE,
        help=f"{DEFAULT_BACKBONE}, tiny-random-head32, or a Hugging Face model directory",
    )
    parser.add_argument(
        "--batch", type=int, default=1000, help="requests decoded together (at least the largest bank pool)"
    )
    parser.add_argument("--tokens", type=int, default=16, help="output tokens per request")
    parser.add_argument("--rows", type=int, default=4, help="rows per bank")
    parser.add_argument("--parity", type=int, default=16, help="requests checked against tokmem.generate")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    result = run(args)
    console.print_json(data={k: v for k, v in result.items() if k != "machine"})
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
