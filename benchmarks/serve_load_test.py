"""A bounded load test of `tokmem serve` on loopback: many clients over many banks, banks replaced mid-run.

Starts the server in-process on 127.0.0.1 (a free port) over a folder of random banks, sends a fixed
number of requests from concurrent clients (chat and text completions, a third of them streamed, two
open-set thresholds), and replaces some banks through ``PUT /v1/banks/NAME`` while requests are in
flight.  Then it checks that no request was lost and that every answer equals offline
``tokmem.generate`` with the bank revision the answer reports.  Exits 1 on any failure; the whole run
is bounded by ``--time-limit``.

    python benchmarks/serve_load_test.py --requests 200 --banks 20 --concurrency 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import httpx2
import openai
import torch
import uvicorn

import tokmem
from tokmem import DecodeConfig, load_backbone
from tokmem.backbones import Backbone
from tokmem.bank.file_format import metadata_path
from tokmem.io import write_json_atomic
from tokmem.report import machine
from tokmem.serve.api import create_app
from tokmem.serve.banks import BankRegistry, revision
from tokmem.serve.config import ServeConfig
from tokmem.serve.engine import Engine

QUERIES = [
    "Reverse apple.",
    "hi",
    "What is the weather like today?",
    "Write house in capitals.",
    "Double water, please.",
    "Name three colours.",
    "Sort 3, 1, 2.",
]
THRESHOLDS = (0.0, 0.5)


@dataclass
class Answer:
    bank: str
    query: str
    threshold: float
    revision: str
    text: str


def write_bank(backbone: Backbone, path: Path, seed: int, scale: float) -> tokmem.TokMemModel:
    """A bank of 1-6 random rows (odd seeds decoupled) saved at ``path``."""
    model = tokmem.create(backbone, decoupled=seed % 2 == 1)
    generator = torch.Generator().manual_seed(seed)
    rows = int(torch.randint(1, 7, (1,), generator=generator))
    model.bank.add([f"p{j}" for j in range(rows)], backbone.mean_embedding())
    model.bank.index = torch.randn(model.bank.index.shape, generator=generator) * scale
    if model.bank.decoupled:
        model.bank.steer = torch.randn(model.bank.steer.shape, generator=generator) * scale
    model.bank.save(path)
    return model


class LoopbackServer:
    """uvicorn in a background thread on 127.0.0.1, on a free port."""

    def __init__(self, app):
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join()


async def ask(
    client: openai.AsyncOpenAI, index: int, bank: str, query: str, threshold: float, max_tokens: int
) -> Answer:
    """One request: chat or text completion, streamed or not (by ``index``)."""
    options = dict(model=bank, max_tokens=max_tokens, extra_body={"threshold": threshold}, stream=index % 3 == 0)
    chat = index % 2 == 0
    if chat:
        response = await client.chat.completions.create(messages=[{"role": "user", "content": query}], **options)
    else:
        response = await client.completions.create(prompt=query, **options)
    if not options["stream"]:
        choice = response.choices[0]
        return Answer(
            bank, query, threshold, response.tokmem["bank_revision"], choice.message.content if chat else choice.text
        )
    pieces, extra = [], {}
    async for chunk in response:
        pieces += [(choice.delta.content if chat else choice.text) or "" for choice in chunk.choices]
        extra.update(chunk.model_extra or {})
    return Answer(bank, query, threshold, extra["tokmem"]["bank_revision"], "".join(pieces))


async def load(
    base_url: str,
    banks: list[str],
    replacements: dict[str, tuple[bytes, bytes]],
    requests: int,
    concurrency: int,
    max_tokens: int,
    seed: int,
) -> tuple[list[Answer | BaseException], dict[str, str]]:
    """Send ``requests`` requests, ``concurrency`` at a time; a third of the way in, upload the replacements."""
    rng = random.Random(seed)
    jobs = [(rng.choice(banks), rng.choice(QUERIES), rng.choice(THRESHOLDS)) for _ in range(requests)]
    gate = asyncio.Semaphore(concurrency)
    third_done, finished, uploaded = asyncio.Event(), [0], {}
    async with httpx2.AsyncClient(base_url=base_url, timeout=300) as http:
        client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", http_client=http, max_retries=0)

        async def one(index, job):
            async with gate:
                try:
                    return await ask(client, index, *job, max_tokens)
                finally:
                    finished[0] += 1
                    if finished[0] >= requests // 3:
                        third_done.set()

        async def replace():
            await third_done.wait()
            for name, (tensors, metadata) in replacements.items():
                response = await http.put(f"/v1/banks/{name}", files={"tensors": tensors, "metadata": metadata})
                response.raise_for_status()
                uploaded[name] = response.json()["revision"]

        replacing = asyncio.create_task(replace())
        answers = await asyncio.gather(*[one(i, job) for i, job in enumerate(jobs)], return_exceptions=True)
        await replacing
    return answers, uploaded


def check(answers: list, models: dict[str, tokmem.TokMemModel], max_tokens: int) -> tuple[int, list[str]]:
    """(answers equal to offline generate, problems)."""
    problems = [f"request {i} failed: {a!r}" for i, a in enumerate(answers) if isinstance(a, BaseException)]
    groups = defaultdict(list)
    for answer in answers:
        if isinstance(answer, Answer):
            groups[answer.revision, answer.threshold].append(answer)
    equal = 0
    for (digest, threshold), group in groups.items():
        if digest not in models:
            problems.append(f"unknown bank revision {digest}")
            continue
        queries = sorted({a.query for a in group})
        offline = tokmem.generate(models[digest], queries, DecodeConfig(max_new_tokens=max_tokens, threshold=threshold))
        texts = {q: g.text for q, g in zip(queries, offline)}
        for answer in group:
            if answer.text == texts[answer.query]:
                equal += 1
            else:
                problems.append(
                    f"{answer.bank} ({digest}) {answer.query!r}: served {answer.text!r}, offline {texts[answer.query]!r}"
                )
    return equal, problems


def run(
    backbone: Backbone,
    banks: int = 20,
    requests: int = 200,
    concurrency: int = 32,
    max_tokens: int = 16,
    replace: int = 3,
    time_limit: float = 300,
    max_batch: int = 32,
    scale: float = 0.7,
    seed: int = 0,
) -> dict:
    """The whole load test; returns the summary (``ok`` false when anything was lost or differs)."""
    with tempfile.TemporaryDirectory() as tmp:
        directory, staging = Path(tmp) / "banks", Path(tmp) / "replacements"
        directory.mkdir()
        staging.mkdir()
        names = [f"bank{i}" for i in range(banks)]
        models, replacements = {}, {}
        for i, name in enumerate(names):
            path = directory / f"{name}.safetensors"
            model = write_bank(backbone, path, seed * 100_003 + i, scale)
            models[revision(path.read_bytes(), metadata_path(path).read_bytes())] = model
        for i, name in enumerate(names[:replace]):
            path = staging / f"{name}.safetensors"
            model = write_bank(backbone, path, seed * 100_003 + banks + i, scale)
            replacements[name] = (path.read_bytes(), metadata_path(path).read_bytes())
            models[revision(*replacements[name])] = model
        engine = Engine(backbone, max_batch=max_batch, max_queue=requests)
        app = create_app(
            BankRegistry(backbone, directory, max_resident=max(1, banks // 2)),
            engine,
            ServeConfig(banks=str(directory), bank_tools=True),  # answers compared with generate: every row routes
        )
        start = time.perf_counter()
        with LoopbackServer(app) as base_url:
            try:
                answers, uploaded = asyncio.run(
                    asyncio.wait_for(
                        load(base_url, names, replacements, requests, concurrency, max_tokens, seed), time_limit
                    )
                )
            except TimeoutError:
                answers, uploaded = [TimeoutError(f"the run passed its limit of {time_limit:g} s")], {}
        seconds = time.perf_counter() - start
    equal, problems = check(answers, models, max_tokens)
    replaced_answers = sum(isinstance(a, Answer) and a.revision in uploaded.values() for a in answers)
    return {
        "requests": requests,
        "answered": sum(isinstance(a, Answer) for a in answers),
        "equal_to_generate": equal,
        "replaced_banks": len(uploaded),
        "answers_from_replacements": replaced_answers,
        "seconds": round(seconds, 2),
        "requests_per_s": round(requests / seconds, 2),
        "ok": not problems and equal == requests,
        "problems": problems[:10],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backbone", default="tiny-random")
    parser.add_argument("--banks", type=int, default=20)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--replace", type=int, default=3, help="banks replaced mid-run")
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--time-limit", type=float, default=300, help="seconds for the whole run")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="PATH", help="write the summary, the options and the machine here")
    args = parser.parse_args(argv)
    backbone = load_backbone(args.backbone, device=args.device)
    summary = run(
        backbone,
        args.banks,
        args.requests,
        args.concurrency,
        args.max_tokens,
        args.replace,
        args.time_limit,
        args.max_batch,
        seed=args.seed,
    )
    print(json.dumps(summary, indent=2))
    if args.json:
        write_json_atomic(
            args.json,
            {"options": {k: v for k, v in vars(args).items() if k != "json"}, **summary, "machine": machine()},
        )
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
