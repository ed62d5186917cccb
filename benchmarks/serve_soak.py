"""A bounded soak of `tokmem serve` on loopback: clean and hostile clients together, banks replaced mid-run.

Starts ``tokmem serve`` as a child process on 127.0.0.1 over a folder of random banks and sends a fixed
number of requests, ``--concurrency`` at a time; every ``--hostile-every``-th one is malformed or hostile
(tiny temperatures, overflowing integers, lone surrogates, over-long prompts, broken or deep JSON, unknown
banks, bad uploads, oversized bodies, clients that leave mid-stream).  A third and two thirds of the way in,
some banks are replaced through ``PUT /v1/banks/NAME``.  Then it checks that every clean request was answered
and equals offline ``tokmem.generate`` with the bank revision it reports, that every hostile one got its
expected status, that none was lost or hung, and that the server's log has no traceback; it reports the
server's RSS growth and sends SIGTERM, expecting a clean exit.  Exits 1 on any failure.

    python benchmarks/serve_soak.py --requests 2000 --concurrency 64 --json results/serve_soak.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx2
import openai
import psutil
from serve_load_test import QUERIES, THRESHOLDS, Answer, ask, check, write_bank

from tokmem import load_backbone
from tokmem.bank.file_format import metadata_path
from tokmem.serve.banks import revision

MAX_PROMPT_CHARS = 4000
MAX_BODY_MB = 1.0
JSON_TYPE = {"content-type": "application/json"}


def hostile_requests(upload: tuple[bytes, dict]) -> dict:
    """kind -> (method, path, httpx options, expected status); None: a client that leaves mid-stream."""
    tensors, metadata = upload

    def chat(**fields) -> dict:
        return {"json": {"model": "bank0", "messages": [{"role": "user", "content": "hi"}], **fields}}

    def bad_upload(**fields) -> dict:
        return {"files": {"tensors": tensors, "metadata": json.dumps({**metadata, **fields}).encode()}}

    return {
        "tiny-temperature": ("POST", "/v1/chat/completions", chat(temperature=1e-45), 400),
        "overflowing-max-steps": ("POST", "/v1/chat/completions", chat(max_steps=2**63), 400),
        "lone-surrogate": (
            "POST",
            "/v1/chat/completions",
            {"content": b'{"model": "bank0", "prompt": "\\ud800"}', "headers": JSON_TYPE},
            400,
        ),
        "long-prompt": (
            "POST",
            "/v1/completions",
            {"json": {"model": "bank0", "prompt": "x" * (MAX_PROMPT_CHARS + 1)}},
            400,
        ),
        "not-json": ("POST", "/v1/completions", {"content": b"{nope", "headers": JSON_TYPE}, 400),
        "deep-json": ("POST", "/v1/completions", {"content": b"[" * 5000 + b"]" * 5000, "headers": JSON_TYPE}, 400),
        "two-choices": ("POST", "/v1/chat/completions", chat(n=2), 400),
        "unknown-bank": ("POST", "/v1/completions", {"json": {"model": "nope", "prompt": "hi"}}, 404),
        "bad-upload-names": ("PUT", "/v1/banks/junk", bad_upload(names=[[1], [2]]), 400),
        "bad-upload-backbone": ("PUT", "/v1/banks/junk", bad_upload(backbone="x"), 400),
        "traversal-upload": ("PUT", "/v1/banks/..%2Fbank0", bad_upload(), 400),
        "oversized-body": (
            "POST",
            "/v1/completions",
            {"content": b"x" * int(MAX_BODY_MB * 2**20 + 1), "headers": JSON_TYPE},
            413,
        ),
        "leaves-mid-stream": (
            "POST",
            "/v1/completions",
            {"json": {"model": "bank1", "prompt": "hi", "stream": True, "max_tokens": 64, "ignore_eos": True}},
            None,
        ),
    }


async def hostile(http: httpx2.AsyncClient, kind: str, job: tuple) -> tuple[str, int | str]:
    method, path, options, status = job
    if status is None:
        async with http.stream(method, path, **options) as response:
            async for _ in response.aiter_bytes():
                break  # the first chunk, then gone
        return kind, "left"
    response = await http.request(method, path, **options)
    return kind, response.status_code


async def load(
    base: str, names: list[str], hostiles: dict, replacements: list[dict], args, on_warm
) -> tuple[list, list]:
    """Send every request; ``on_warm()`` when a tenth of them are done (the server's caches have filled)."""
    rng = random.Random(args.seed)
    kinds = sorted(hostiles)
    jobs = [
        ("hostile", rng.choice(kinds))
        if i % args.hostile_every == 0
        else ("clean", (rng.choice(names), rng.choice(QUERIES), rng.choice(THRESHOLDS)))
        for i in range(args.requests)
    ]
    gate, done = asyncio.Semaphore(args.concurrency), [0]
    marks = [asyncio.Event() for _ in replacements]
    async with httpx2.AsyncClient(base_url=base, timeout=args.request_timeout) as http:
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", http_client=http, max_retries=0)

        async def one(index, job):
            async with gate:
                try:
                    if job[0] == "hostile":
                        return await hostile(http, job[1], hostiles[job[1]])
                    return await ask(client, index, *job[1], args.max_tokens)
                finally:
                    done[0] += 1
                    if done[0] == args.requests // 10:
                        on_warm()
                    for k, mark in enumerate(marks):
                        if done[0] >= args.requests * (k + 1) // (len(marks) + 1):
                            mark.set()

        async def replace(k, files):
            await marks[k].wait()
            for name, (tensors, metadata) in files.items():
                response = await http.put(f"/v1/banks/{name}", files={"tensors": tensors, "metadata": metadata})
                response.raise_for_status()

        replacing = [asyncio.create_task(replace(k, files)) for k, files in enumerate(replacements)]
        results = await asyncio.gather(*[one(i, job) for i, job in enumerate(jobs)], return_exceptions=True)
        await asyncio.gather(*replacing)
    return jobs, results


def start_server(directory: Path, args, log) -> tuple[subprocess.Popen, str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [
        sys.executable,
        "-c",
        "import sys; from tokmem.cli import main; sys.exit(main())",
        "serve",
        "--backbone",
        args.backbone,
        "--device",
        args.device,
        "--banks",
        str(directory),
        "--port",
        str(port),
        "--max-prompt-chars",
        str(MAX_PROMPT_CHARS),
        "--max-body-mb",
        str(MAX_BODY_MB),
        "--max-batch",
        str(args.max_batch),
        "--bank-tools",  # the clean answers are compared with generate's, where every row routes
    ]
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx2.get(f"{base}/health", timeout=2).status_code == 200:
                return server, base
        except httpx2.TransportError:
            time.sleep(0.2)
    server.kill()
    raise RuntimeError("the server did not start within 120 s")


def stop_server(server: subprocess.Popen) -> dict:
    """SIGTERM; uvicorn shuts down gracefully and then re-raises the signal, so a clean exit is -SIGTERM (or 0)."""
    start = time.perf_counter()
    server.send_signal(signal.SIGTERM)
    try:
        code = server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
        code = "killed after 60 s"
    return {"exit_code": code, "seconds": round(time.perf_counter() - start, 2)}


def clean_exit(shutdown: dict, server_log: str) -> bool:
    return shutdown["exit_code"] in (0, -signal.SIGTERM) and "Application shutdown complete" in server_log


def summarise(jobs, results, hostiles, models, uploaded_rounds, args) -> dict:
    clean = [r for job, r in zip(jobs, results) if job[0] == "clean"]
    equal, problems = check(clean, models, args.max_tokens)
    statuses, lost = Counter(), []
    for job, result in zip(jobs, results):
        if isinstance(result, BaseException):
            lost.append(f"{job[0]} {job[1]}: {result!r}"[:300])
        elif job[0] == "hostile":
            statuses[f"{result[0]}: {result[1]}"] += 1
            expected = hostiles[result[0]][3]
            if result[1] != (expected if expected is not None else "left"):
                problems.append(f"hostile {result[0]}: status {result[1]}, expected {expected}")
    return {
        "clean_requests": len(clean),
        "clean_answered": sum(isinstance(a, Answer) for a in clean),
        "equal_to_generate": equal,
        "hostile_requests": len(jobs) - len(clean),
        "hostile_statuses": dict(sorted(statuses.items())),
        "lost_or_hung": len(lost),
        "replacement_rounds": uploaded_rounds,
        "problems": (lost + problems)[:20],
    }


def make_banks(backbone, directory: Path, staging: Path, args) -> tuple[list[str], dict, list[dict]]:
    """The served banks, the offline model of every revision, and two rounds of replacement files."""
    names = [f"bank{i}" for i in range(args.banks)]
    models, rounds = {}, []
    for i, name in enumerate(names):
        path = directory / f"{name}.safetensors"
        model = write_bank(backbone, path, i, args.scale)
        models[revision(path.read_bytes(), metadata_path(path).read_bytes())] = model
    for k in (1, 2):
        files = {}
        for i, name in enumerate(names[: args.replace]):
            path = staging / f"{k}-{name}.safetensors"
            model = write_bank(backbone, path, 1000 * k + i, args.scale)
            files[name] = (path.read_bytes(), metadata_path(path).read_bytes())
            models[revision(*files[name])] = model
        rounds.append(files)
    return names, models, rounds


def run(args) -> dict:
    """Serve the banks, load the server with clean and hostile requests, stop it; the summary and whether it held."""
    backbone = load_backbone(args.backbone, device=args.device)
    with tempfile.TemporaryDirectory() as tmp:
        seen = soak(backbone, Path(tmp), args)
    summary = summarise(seen["jobs"], seen["results"], seen["hostiles"], seen["models"], seen["rounds"], args)
    tracebacks = seen["server_log"].count("Traceback")
    rss = seen["rss"]
    summary |= {
        "requests": args.requests,
        "concurrency": args.concurrency,
        "seconds": round(seen["seconds"], 1),
        "requests_per_s": round(args.requests / seen["seconds"], 1),
        "server_rss_mb": {
            **{k: round(v / 2**20, 1) for k, v in rss.items()},
            "growth_after_the_first_tenth": round((rss["after_run"] - rss["after_a_tenth"]) / 2**20, 1),
        },
        "sigterm": {**seen["shutdown"], "clean": clean_exit(seen["shutdown"], seen["server_log"])},
        "tracebacks_in_server_log": tracebacks,
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "device": args.device,
        },
        "backbone": args.backbone,
        "banks": args.banks,
        "max_tokens": args.max_tokens,
    }
    summary["ok"] = (
        not summary["problems"]
        and summary["equal_to_generate"] == summary["clean_requests"]
        and summary["lost_or_hung"] == 0
        and tracebacks == 0
        and summary["sigterm"]["clean"]
    )
    return summary


def soak(backbone, tmp: Path, args) -> dict:
    """The banks written under ``tmp``, the server started over them, the load run, the server stopped: what was
    seen (the requests and their answers, the server's memory at three points, its log and its exit)."""
    directory, staging = tmp / "banks", tmp / "staging"
    directory.mkdir()
    staging.mkdir()
    names, models, rounds = make_banks(backbone, directory, staging, args)
    upload = rounds[0][names[0]]
    hostiles = hostile_requests((upload[0], json.loads(upload[1])))
    log_path = tmp / "server.log"
    with open(log_path, "wb") as log:
        server, base = start_server(directory, args, log)
        process = psutil.Process(server.pid)
        rss = {"after_start": process.memory_info().rss}
        start = time.perf_counter()

        def at_a_tenth():
            rss.setdefault("after_a_tenth", process.memory_info().rss)

        jobs, results = asyncio.run(load(base, names, hostiles, rounds, args, at_a_tenth))
        seconds = time.perf_counter() - start
        rss["after_run"] = process.memory_info().rss
        shutdown = stop_server(server)
    return {
        "jobs": jobs,
        "results": results,
        "hostiles": hostiles,
        "models": models,
        "rounds": len(rounds),
        "rss": rss,
        "seconds": seconds,
        "shutdown": shutdown,
        "server_log": log_path.read_text(errors="replace"),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backbone", default="tiny-random")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--hostile-every", type=int, default=3, help="every n-th request is hostile (3: a third)")
    parser.add_argument("--banks", type=int, default=12)
    parser.add_argument("--replace", type=int, default=3, help="banks replaced in each of the two mid-run rounds")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--scale", type=float, default=0.7, help="size of the random bank rows")
    parser.add_argument(
        "--request-timeout", type=float, default=120, help="a request not answered by then counts as hung"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the summary here")
    args = parser.parse_args(argv)
    summary = run(args)
    text = json.dumps(
        {
            "command": " ".join(["python", "benchmarks/serve_soak.py", *(argv if argv is not None else sys.argv[1:])]),
            **summary,
        },
        indent=2,
    )
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
