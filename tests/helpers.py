"""Helpers shared by the test modules."""

import contextlib
import importlib.util
import sys
from pathlib import Path

import torch
from pydantic import BaseModel

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"
TRAVEL = Path(__file__).parents[1] / "examples" / "travel"


def load_script(name: str):
    """A script of benchmarks/ as a module (its folder on the path, as when it runs: a script may import another)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def travel_script(name: str):
    """A script of examples/travel/ as a module (its folder on the path, as when it runs)."""
    if str(TRAVEL) not in sys.path:
        sys.path.insert(0, str(TRAVEL))
    spec = importlib.util.spec_from_file_location(f"travel_{name}", TRAVEL / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Interrupted(Exception):
    pass


def interrupt_at(step: int):
    """An ``on_step`` callback that stops a training after its ``step``-th optimiser step."""

    def on_step(done: int, total: int) -> None:
        if done == step:
            raise Interrupted

    return on_step


def random_rows(bank, seed: int = 0, scale: float = 1.0) -> None:
    """Give every row of the bank distinct random values (index and, for DC, a different steer; tails and shared rows
    too)."""
    generator = torch.Generator().manual_seed(seed)
    bank.index = torch.randn(bank.index.shape, generator=generator) * scale
    if bank.decoupled:
        bank.steer = torch.randn(bank.steer.shape, generator=generator) * scale
    if bank.memory_tokens > 1:
        bank.tail = torch.randn(bank.tail.shape, generator=generator) * scale
    if bank.shared_tokens:
        bank.shared = torch.randn(bank.shared.shape, generator=generator) * scale


# banks the server tests serve: name -> (rows, decoupled); rows are random, scaled so that memory tokens
# and words both show up in greedy output on the lively backbone
SERVED_BANKS = {"alpha": (3, False), "beta": (4, True), "gamma": (1, False), "empty": (0, False)}


def write_bank(backbone, path, rows: int, decoupled: bool = False, seed: int = 0):
    """Save a bank of ``rows`` random rows (procedures p0, p1, …) tied to ``backbone``; returns its model."""
    import tokmem

    model = tokmem.create(backbone, decoupled=decoupled)
    if rows:
        model.bank.add([f"p{i}" for i in range(rows)], backbone.mean_embedding())
        random_rows(model.bank, seed=seed, scale=0.7)
    model.bank.save(path)
    return model


CITY = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Oslo", "Rome"]}}, "required": ["city"]}
COUNT = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def city_count_model(backbone, **form):
    """A model with the two tools city and count (their schemas kept), its rows random; ``form``: the bank's
    (``tokmem.create``'s ``shows_schemas``, ``memory_tokens``, ``shared_tokens``)."""
    import tokmem

    model = tokmem.create(backbone, **form)
    model.bank.add(["city", "count"], backbone.mean_embedding(), kinds=["tool", "tool"], schemas=[CITY, COUNT])
    random_rows(model.bank, scale=0.7)
    return model


def city_count_chain():
    """An example that calls city, then count, each with its result."""
    from tokmem import Example, Step

    return Example(
        "Weather in Rome, then count.",
        (
            Step("city", '{"name":"city","arguments":{"city":"Rome"}}', result="sunny"),
            Step("count", '{"name":"count","arguments":{"n":3}}', result="3 apples"),
        ),
    )


def example_messages(example) -> list[dict]:
    """An example's query, calls and results as the OpenAI messages a client sends."""
    import json

    messages = [{"role": "user", "content": example.query}]
    for k, step in enumerate(example.steps):
        call = json.loads(step.response)
        function = {"name": call["name"], "arguments": json.dumps(call["arguments"])}
        messages.append({"role": "assistant", "content": None, "tool_calls": [{"id": f"c{k}", "function": function}]})
        messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": step.result})
    return messages


def tool_bank(backbone, shows_schemas: bool = False, seed: int = 0):
    """A model whose bank has two tool rows with schemas (city, count) and a text row (chat), rows random."""
    import tokmem

    model = tokmem.create(backbone, shows_schemas=shows_schemas)
    model.bank.add(
        ["city", "count", "chat"],
        backbone.mean_embedding(),
        kinds=["tool", "tool", "text"],
        schemas=[CITY, COUNT, None],
    )
    random_rows(model.bank, seed, scale=0.7)
    return model


def write_tool_bank(backbone, path, shows_schemas: bool = False):
    """Save ``tool_bank``; returns its model."""
    model = tool_bank(backbone, shows_schemas)
    model.bank.save(path)
    return model


PINGED = [  # a call of ``ping_bank``'s tool and its result
    {"role": "user", "content": "Ping the server."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "a", "type": "function", "function": {"name": "ping", "arguments": "{}"}}],
    },
    {"role": "tool", "tool_call_id": "a", "content": "pong"},
]


def ping_bank(backbone, **form):
    """A bank of one tool without parameters (``ping``): with the open-set threshold at 0 every turn calls it, always
    with ``{}``, so a turn after its result (``PINGED``) would call it again with the same arguments.  ``form``: the
    bank's (``tokmem.create``'s ``memory_tokens``, ...)."""
    import tokmem

    model = tokmem.create(backbone, **form)
    model.bank.add(["ping"], backbone.mean_embedding(), kinds=["tool"], schemas=[{"type": "object", "properties": {}}])
    return model


def write_served_banks(backbone, directory) -> dict:
    """Every bank of SERVED_BANKS in ``directory``; returns name -> model (the offline reference)."""
    return {
        name: write_bank(backbone, directory / f"{name}.safetensors", rows, decoupled, seed=i)
        for i, (name, (rows, decoupled)) in enumerate(SERVED_BANKS.items())
    }


def edited_bank_file(bank, path, change):
    """``bank`` saved to ``path``, then its files rewritten with ``change(metadata, tensors)`` applied (a file as a
    bug or a hand edit would leave it); returns ``path``."""
    import json

    from safetensors.torch import load_file, save_file

    bank.save(path)
    meta_path = path.with_suffix(".safetensors.json")
    tensors, meta = load_file(path), json.loads(meta_path.read_text())
    change(meta, tensors)
    save_file(tensors, path)
    meta_path.write_text(json.dumps(meta))
    return path


def bank_files(path) -> tuple[bytes, bytes]:
    """(safetensors, JSON) bytes of a saved bank: what an upload sends."""
    from tokmem.bank.file_format import metadata_path

    return path.read_bytes(), metadata_path(path).read_bytes()


# ---- the server, in-process ----------------------------------------------------------------------------
def serve(backbone, directory, engine_options=None, **settings):
    """The app over ``directory`` with ``ServeConfig(**settings)``, and its engine (not started)."""
    from tokmem.serve.api import create_app
    from tokmem.serve.banks import BankRegistry
    from tokmem.serve.config import ServeConfig
    from tokmem.serve.engine import Engine

    engine = Engine(backbone, **(engine_options or {}))
    config = ServeConfig(banks=str(directory), **settings)
    return create_app(BankRegistry(backbone, directory, budget=config.schema_budget), engine, config), engine


def call_running(app, engine, scenario):
    """``call`` with the engine running, stopped after (whatever the scenario raised)."""
    engine.start()
    try:
        return call(app, scenario)
    finally:
        engine.stop()


def call(app, scenario, api_key="unused"):
    """Run ``scenario(client, http)`` against the app: an openai client and a raw httpx one."""
    import asyncio

    import httpx2
    import openai

    async def main():
        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://tokmem") as http:
            client = openai.AsyncOpenAI(base_url="http://tokmem/v1", api_key=api_key, http_client=http, max_retries=0)
            return await scenario(client, http)

    return asyncio.run(main())


def expected(offline, bank, query, max_tokens=10, **options):
    """The offline answer (``tokmem.generate``) a served request must equal."""
    import tokmem

    return tokmem.generate(offline[bank], [query], tokmem.DecodeConfig(max_new_tokens=max_tokens, **options))[0]


def files(directory) -> dict:
    """Every file under ``directory`` with its bytes (a folder: None): what a refused request must leave unchanged."""
    return {p.name: p.read_bytes() if p.is_file() else None for p in sorted(directory.rglob("*"))}


@contextlib.contextmanager
def loopback(app, **settings):
    """Serve ``app`` under uvicorn on 127.0.0.1 (a free port) in a thread, with ``ServeConfig(**settings)``'s
    connection limits; yields (host, port)."""
    import threading
    import time

    import uvicorn

    from tokmem.serve.config import ServeConfig
    from tokmem.serve.server import uvicorn_config

    server = uvicorn.Server(uvicorn_config(app, ServeConfig(banks="", port=0, **settings), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield server.servers[0].sockets[0].getsockname()[:2]
    finally:
        server.should_exit = True
        thread.join()


# queries the decoding and engine tests answer: different lengths and kinds
QUERIES = [
    "Reverse apple.",
    "hi",
    "What is the weather like today?",
    "Write house in capitals.",
    "Double water, please.",
]

# the ASGI scope of a POST /v1/completions, for tests that drive the app's raw ASGI interface
COMPLETION_SCOPE = {
    "type": "http",
    "method": "POST",
    "path": "/v1/completions",
    "raw_path": b"/v1/completions",
    "query_string": b"",
    "headers": [(b"content-type", b"application/json")],
    "root_path": "",
    "scheme": "http",
    "server": ("t", 80),
}


def fuzz_settings(examples: int):
    """Hypothesis settings of the server fuzzers: bounded, derandomised (the same requests every run), no database."""
    from hypothesis import HealthCheck, settings

    return settings(
        max_examples=examples, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
    )


class Unit(BaseModel):
    name: str
    factor: int


class Measure(BaseModel):
    """A pydantic model whose JSON schema has ``$defs`` and ``$ref`` (nested and in a list): what clients send."""

    value: float
    unit: Unit
    alternatives: list[Unit] = []
