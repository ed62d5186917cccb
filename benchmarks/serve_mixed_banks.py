"""What mixing banks in one batch costs the server, how fast a bank upload takes effect, and what TokMem
saves against RAG in prompt length.

1. Decode throughput of the engine with a batch of ``--batch`` rows whose requests are spread over 1,
   10, 100 and 1,000 distinct banks (request ``j`` of the run uses bank ``j mod k``), the same prompts
   and ``--tokens`` tokens per request (``ignore_eos``), in ``--waves`` waves of one batch each,
   interleaved across the pools.  Only pure decoding steps are timed (prefill and bank loading are
   not): tokens/s = rows / median step time.  A batch holds at most ``--batch`` distinct banks, so with pools of 100 and 1,000 every row
   has its own bank — the most a batch can mix.
2. The bare backbone on the same rows (the transformers forward and an argmax, no bank, no engine):
   what the engine and the bank add per token; and the bank's own operations timed alone (the
   gather for memory ids' embeddings, the extra logits), which a busy machine's noise cannot hide.
3. ``PUT /v1/banks/NAME`` of a 32-row bank through the HTTP app (multipart parsing, validation as
   ``MemoryBank.load``, atomic write, swap) until the new revision serves: p50 over ``--puts``.
4. End-to-end latency (HTTP, one request at a time) of a TokMem answer (the query, then the
   procedure's memory token) against a RAG answer (two demonstrations of the procedure in the prompt,
   the plain backbone; retrieval time not counted) at equal output length (``ignore_eos``).

    python benchmarks/serve_mixed_banks.py --json serve_mixed_banks.json
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import DynamicCache

import tokmem
from tokmem.backbones import Backbone, load_backbone
from tokmem.bank.file_format import metadata_path
from tokmem.data.builtin import catalog, make_example
from tokmem.decoding.batch import left_pad
from tokmem.training.sequences import chat_prefix
from tokmem.model import positions
from tokmem.report import console, machine, write_json
from tokmem.serve.banks import BankRegistry
from tokmem.serve.engine import Engine, Request, bank_tables
from tokmem.cli.options import add_backbone

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: research/ beside src/
from research.methods.rag import demonstration_prompt  # noqa: E402

POOLS = (1, 10, 100, 1000)


def write_banks(backbone: Backbone, directory: Path, count: int, rows: int, seed: int) -> None:
    """``count`` banks of ``rows`` rows named after the built-in procedures, each its own random rows."""
    names = [f"{name}-{i}" for i, name in enumerate(sorted(catalog()) * (rows // len(catalog()) + 1))][:rows]
    bank = tokmem.create(backbone).bank
    bank.add(names, backbone.mean_embedding())
    generator = torch.Generator().manual_seed(seed)
    for i in range(count):
        bank.index = backbone.mean_embedding() * (1 + torch.randn(rows, backbone.hidden_size, generator=generator))
        bank.save(directory / f"bank{i}.safetensors")


def queries(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    names = sorted(catalog())
    return [make_example([names[i % len(names)]], rng).query for i in range(count)]


def decode_steps(
    engine: Engine,
    registry: BankRegistry,
    pool: int,
    wave: int,
    prompts: list[list[int]],
    texts: list[str],
    tokens: int,
) -> list[float]:
    """Seconds of each pure decoding step of one batch whose requests are spread over ``pool`` banks."""
    handles = []
    for row, (prompt, text) in enumerate(zip(prompts, texts)):
        bank = registry.get(f"bank{(wave * len(prompts) + row) % pool}")
        handles.append(engine.submit(Request(bank, prompt, text, max_tokens=tokens, ignore_eos=True, threshold=0.0)))
    engine.step()  # prefill (and the first decoding step)
    steps = []
    while not all(h.finished for h in handles):
        start = time.perf_counter()
        engine.step()
        synchronize(engine.model.device)
        steps.append(time.perf_counter() - start)
    return steps


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so that a host clock times it (a GPU runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def bare_steps(backbone: Backbone, prompts: list[list[int]], tokens: int) -> list[float]:
    """The same for the transformers forward plus argmax on the same rows: no bank, no engine."""
    ids, mask = left_pad(prompts, backbone.tokenizer.pad_token_id, backbone.device)
    position = positions(mask)
    cache = DynamicCache(config=backbone.model.config)
    out = backbone.model(
        input_ids=ids, attention_mask=mask, position_ids=position, past_key_values=cache, use_cache=True
    )
    token, position = out.logits[:, -1].argmax(-1), position[:, -1:]
    steps = []
    for _ in range(tokens - 1):
        start = time.perf_counter()
        mask, position = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1), position + 1
        out = backbone.model(
            input_ids=token.unsqueeze(-1),
            attention_mask=mask,
            position_ids=position,
            past_key_values=cache,
            use_cache=True,
        )
        token = out.logits[:, -1].argmax(-1)
        synchronize(token.device)
        steps.append(time.perf_counter() - start)
    return steps


@torch.no_grad()
def bank_cost_us(engine: Engine, registry: BankRegistry, pool: int, rows: int, repeats: int = 200) -> float:
    """Microseconds per decoding step that the bank's own operations take, timed alone so that the
    backbone's noise is left out: memory ids' input embeddings gathered from each row's bank (against
    the words-only lookup), the extra logits ``h · indexᵀ`` with padding masked, and appending them to
    the vocabulary's logits."""
    model, vocab = engine.model, engine.model.vocab_size
    index, steer, valid = bank_tables([registry.get(f"bank{row % pool}") for row in range(rows)], model.device)
    ids = torch.randint(vocab, vocab + index.shape[1], (rows, 1), device=model.device)
    hidden = torch.randn(rows, index.shape[-1], device=model.device, dtype=index.dtype)
    words = torch.randn(rows, vocab, device=model.device, dtype=index.dtype)  # stands for the LM head's logits

    def median_us(step):
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            step()
            synchronize(model.device)
            times.append(time.perf_counter() - start)
        return 1e6 * statistics.median(times)

    bank = median_us(
        lambda: (model.embed(ids, steer), torch.cat([words, model.memory_logits(hidden, index, valid)], dim=-1))
    )
    return round(bank - median_us(lambda: model.embed(ids.clamp(max=vocab - 1), steer[:, :0])), 1)


def decode_rates(backbone, engine, registry, prompts, texts, tokens, waves) -> tuple[dict, float]:
    """Tokens/s (rows / median step) per pool and of the bare backbone, the waves interleaved so that a
    machine whose load drifts slows every setting alike."""
    steps = {pool: [] for pool in POOLS}
    bare = []
    decode_steps(engine, registry, 1, 0, prompts, texts, tokens)  # warm-up: kernels, allocator, caches
    bare_steps(backbone, prompts, tokens)
    for wave in range(waves):
        for pool in POOLS:
            steps[pool] += decode_steps(engine, registry, pool, wave, prompts, texts, tokens)
        bare += bare_steps(backbone, prompts, tokens)

    def rate(times):
        return round(len(prompts) / statistics.median(times), 2)

    return {str(pool): rate(times) for pool, times in steps.items()}, rate(bare)


async def http_measurements(app, directory: Path, puts: int, tokens: int, repeats: int, seed: int) -> dict:
    """p50 of PUT until the new revision serves; TokMem vs RAG end-to-end latency at equal output length."""
    import httpx2

    uploads = [
        (p.read_bytes(), metadata_path(p).read_bytes())
        for p in (directory / "bank0.safetensors", directory / "bank1.safetensors")
    ]
    rng = random.Random(seed)
    procedure = sorted(catalog())[0]  # bank0's first row is named after it, with the suffix "-0"
    query = make_example([procedure], rng).query
    rag = demonstration_prompt([make_example([procedure], rng) for _ in range(2)], query)
    async with httpx2.AsyncClient(
        transport=httpx2.ASGITransport(app=app), base_url="http://tokmem", timeout=600
    ) as http:
        put_ms = []
        for i in range(puts):
            tensors, metadata = uploads[i % 2]
            start = time.perf_counter()
            response = await http.put("/v1/banks/swapped", files={"tensors": tensors, "metadata": metadata})
            put_ms.append(1000 * (time.perf_counter() - start))
            response.raise_for_status()
        served = await answer(http, {"model": "swapped", "prompt": query, "max_tokens": 2})
        assert served["tokmem"]["bank_revision"] == response.json()["revision"]  # the last upload is what serves

        latency = {"tokmem": [], "rag": []}
        for _ in range(repeats):
            for method, body in (
                ("tokmem", {"model": "bank0", "prompt": query, "procedure": f"{procedure}-0"}),
                ("rag", {"model": "plain", "prompt": rag}),
            ):
                start = time.perf_counter()
                result = await answer(http, {**body, "max_tokens": tokens, "ignore_eos": True})
                latency[method].append(1000 * (time.perf_counter() - start))
                latency[f"{method}_usage"] = result["usage"]
    return {
        "put_p50_ms": round(statistics.median(put_ms), 2),
        "latency_ms": {m: round(statistics.median(latency[m]), 1) for m in ("tokmem", "rag")},
        "prompt_tokens": {m: latency[f"{m}_usage"]["prompt_tokens"] for m in ("tokmem", "rag")},
        "output_tokens": {m: latency[f"{m}_usage"]["completion_tokens"] for m in ("tokmem", "rag")},
    }


def serve_http(registry, engine, directory: Path, args) -> dict:
    from tokmem.serve.api import create_app
    from tokmem.serve.config import ServeConfig

    app = create_app(registry, engine, ServeConfig(banks=str(directory)))
    engine.start()
    try:
        return asyncio.run(http_measurements(app, directory, args.puts, args.tokens, args.repeats, args.seed))
    finally:
        engine.stop()


async def answer(http, body: dict) -> dict:
    response = await http.post("/v1/completions", json=body)
    response.raise_for_status()
    return response.json()


def run(args) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    backbone = load_backbone(args.backbone, device=args.device)
    texts = queries(args.batch, args.seed)
    prompts = [chat_prefix(backbone.tokenizer, q) for q in texts]
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        directory = Path(tmp)
        write_banks(backbone, directory, max(POOLS), args.rows, args.seed)
        tokmem.create(backbone).bank.save(directory / "plain.safetensors")  # an empty bank: the plain backbone
        registry = BankRegistry(backbone, directory, max_resident=max(POOLS) + 2)
        engine = Engine(backbone, max_batch=args.batch)
        rates, bare = decode_rates(backbone, engine, registry, prompts, texts, args.tokens, args.waves)
        console.print(f"decode tokens/s by banks in the run: {rates}; bare backbone: {bare}")
        bank_us = {str(pool): bank_cost_us(engine, registry, pool, args.batch) for pool in POOLS}
        http = {} if args.no_http else serve_http(registry, engine, directory, args)
    overhead = {k: round(1000 * (1 / v - 1 / bare), 3) for k, v in rates.items()}
    return {
        "backbone": args.backbone,
        "device": str(backbone.device),
        "dtype": str(backbone.model.dtype),
        "batch": args.batch,
        "tokens_per_request": args.tokens,
        "waves": args.waves,
        "bank_rows": args.rows,
        "tokens_per_s": rates,
        "ratio": {k: round(v / rates["1"], 3) for k, v in rates.items()},
        "ratio_1000": round(rates["1000"] / rates["1"], 3),
        "bare_tokens_per_s": bare,
        "added_ms_per_token": overhead,
        "bank_us_per_step": bank_us,
        **http,
        "machine": machine(),
    }


def table(result: dict) -> str:
    rows = [
        "| banks in the run | decode tokens/s | ratio to 1 bank | ms/token vs bare backbone | bank alone, µs/step |",
        "|---|---|---|---|---|",
    ]
    for k, rate in result["tokens_per_s"].items():
        rows.append(
            f"| {k} | {rate} | {result['ratio'][k]} | {result['added_ms_per_token'][k]} | {result['bank_us_per_step'][k]} |"
        )
    rows.append(f"| bare backbone | {result['bare_tokens_per_s']} | | | |")
    if "latency_ms" not in result:
        return "\n".join(rows)
    latency, prompt = result["latency_ms"], result["prompt_tokens"]
    return "\n".join(
        rows
        + [
            "",
            f"PUT of a {result['bank_rows']}-row bank until it serves: p50 {result['put_p50_ms']} ms",
            f"end to end, {result['output_tokens']['tokmem']} output tokens: TokMem {latency['tokmem']} ms ({prompt['tokmem']} prompt tokens), "
            f"RAG {latency['rag']} ms ({prompt['rag']} prompt tokens)",
        ]
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_backbone(parser)
    parser.add_argument("--device", default=None)
    parser.add_argument("--batch", type=int, default=32, help="rows decoded together")
    parser.add_argument("--tokens", type=int, default=8, help="tokens per request")
    parser.add_argument("--waves", type=int, default=3, help="batches per bank pool (interleaved across pools)")
    parser.add_argument("--rows", type=int, default=32, help="rows per bank")
    parser.add_argument("--puts", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3, help="latency measurements per method (median)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", help="where the bank folder goes (default: the system's temporary folder)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument(
        "--no-http", action="store_true", help="decode measurements only (no upload or latency over HTTP)"
    )
    parser.add_argument("--json", metavar="PATH", required=True)
    args = parser.parse_args(argv)
    result = run(args)
    write_json(args.json, result)
    console.print(table(result))


if __name__ == "__main__":
    main()
