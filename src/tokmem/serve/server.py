"""``tokmem serve``: the app over a bank directory, under uvicorn with the configured connection limits."""

from __future__ import annotations

import uvicorn
from fastapi import FastAPI

from tokmem.serve.api import create_app
from tokmem.serve.banks import BankRegistry
from tokmem.serve.config import ServeConfig
from tokmem.serve.engine import Engine
from tokmem.serve.guards import header_deadline_protocol


def build(config: ServeConfig, backbone) -> FastAPI:
    """The app for ``config`` on a loaded backbone."""
    registry = BankRegistry(backbone, config.banks, max_resident=config.max_resident, budget=config.schema_budget)
    engine = Engine(backbone, max_batch=config.max_batch, max_queue=config.max_queue, seed=config.seed)
    return create_app(registry, engine, config)


def uvicorn_config(app: FastAPI, config: ServeConfig, **options) -> uvicorn.Config:
    """uvicorn's settings: the address, read deadlines and the connection limit (503 beyond it)."""
    return uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        http=header_deadline_protocol(config.header_timeout),
        timeout_keep_alive=config.keep_alive,
        limit_concurrency=config.max_connections,
        timeout_graceful_shutdown=int(config.timeout) + 1,
        h11_max_incomplete_event_size=64 * 1024,
        **options,
    )


def run(config: ServeConfig, backbone) -> None:
    uvicorn.Server(uvicorn_config(build(config, backbone), config)).run()
