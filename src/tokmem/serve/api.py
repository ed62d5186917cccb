"""The HTTP routes: OpenAI-compatible completions over banks, bank management, models and health.

The ``model`` field of a request names the bank.  Answers are split into segments by
``tokmem.decoding.decode`` (memory tokens never reach ``content``); the routed procedures and the segments
come back in a ``tokmem`` field (of the response, or of the streamed chunk that carries
``finish_reason``).  Per-request extras ride in the body: ``procedure`` (force one, routing
skipped), ``threshold`` (the open-set rule), ``max_steps`` (segments per answer), ``ignore_eos`` and
``schema`` (false: tool arguments decode without their schemas).

Chat requests speak OpenAI's tools API through ``tokmem.chat``'s rules: the conversation (assistant
``tool_calls`` turns, ``role: "tool"`` results) is laid out by ``conversation_ids``, ``tools``/``tool_choice`` map
through ``tool_routing``, and an answer that starts with a tool row's memory token comes back as
``message.tool_calls`` (``reply_from``) with ``finish_reason: "tool_calls"``; streamed, as tool-call deltas.
The bodies and their bounds are in ``protocol``; the key and body limits in ``guards``.

The routes parse and check the bodies and map errors to statuses; answering them is ``serving``'s.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI, File, Request, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.routing import Match

from tokmem.errors import TokMemError, clipped
from tokmem.serve.banks import (
    BankNotFound,
    BankRegistry,
    stamp,
)
from tokmem.serve.config import ServeConfig
from tokmem.serve.engine import Engine
from tokmem.serve.guards import Auth, BodyGuard
from tokmem.serve.protocol import (
    CHAT,
    COMPLETION,
    ApiError,
    ChatBody,
    CompletionBody,
    ErrorBody,
)
from tokmem.serve.serving import CompletionService, api_error

log = logging.getLogger(__name__)
# what each status this server answers means (its body is always ``ErrorBody``); 405 comes with an Allow header
STATUSES = {
    400: "a bad request (or bank upload): the message names the field",
    401: "the route needs 'Authorization: Bearer <api key>' (a server started with --api-key)",
    404: "no bank (model) of that name, or no route for the path",
    408: "the request body took longer than the server's limit to arrive",
    409: "something that is not a bank file stands where the bank would be written",
    413: "the request body is over the server's size limit",
    429: "the server's queue is full: retry later",
    500: "the server failed on this request (other requests are not affected)",
    504: "the answer took longer than the server's time limit",
}


def errors(*statuses: int) -> dict:
    """The OpenAPI ``responses`` of a route that may answer ``statuses``, and what any route may answer."""
    return {status: {"model": ErrorBody, "description": STATUSES[status]} for status in (*statuses, 408, 413, 500)}


ANSWERS = errors(400, 401, 404, 429, 504) | {
    200: {
        "description": "the answer: JSON, or with 'stream': true server-sent events ('data: {chunk}' … 'data: [DONE]')",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
}


def create_app(registry: BankRegistry, engine: Engine, config: ServeConfig) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app):
        engine.start()
        yield
        engine.stop()

    app = FastAPI(title="tokmem", lifespan=lifespan)
    app.add_middleware(BodyGuard, limit=config.max_body_bytes, seconds=config.body_timeout)
    app.add_middleware(Auth, api_key=config.api_key, protect=config.protect)  # added last: runs first
    _error_handlers(app)
    _documented(app)
    _info_routes(app, registry, engine)
    _completion_routes(app, CompletionService(registry, engine, config))
    _bank_routes(app, registry)
    return app


def _info_routes(app: FastAPI, registry: BankRegistry, engine: Engine) -> None:
    def model(name: str) -> dict | None:
        when = stamp(registry.path(name))
        if when is None:
            return None
        return {
            "id": name,
            "object": "model",
            "created": when[0][1] // 10**9,
            "owned_by": "tokmem",
            "parent": registry.backbone.name,
        }

    @app.get("/health", responses=errors())
    def health():
        return {
            "status": "ok",
            "backbone": registry.backbone.name,
            "resident_banks": registry.resident,
            "running": engine.running,
            "queued": len(engine.pending),
        }

    @app.get("/v1/models", responses=errors(401))
    def models():
        return {"object": "list", "data": [m for m in map(model, registry.names()) if m is not None]}

    @app.get("/v1/models/{name:path}", responses=errors(400, 401, 404))
    def retrieve_model(name: str):
        found = model(name)
        if found is None:
            raise BankNotFound(f"no bank named '{name}'")
        return found


def _completion_routes(app: FastAPI, service: CompletionService) -> None:
    @app.post("/v1/chat/completions", responses=ANSWERS)
    async def chat_completions(body: ChatBody, request: Request):
        if body.messages[-1].role not in ("user", "tool"):
            raise ApiError(400, "the last message must be the user's or a tool result", param="messages")
        messages = [m.as_dict() for m in body.messages]
        max_tokens = body.max_completion_tokens or body.max_tokens
        chars = sum(m.chars() for m in body.messages)
        return await service.answer(CHAT, body, request, messages, messages[-1]["content"], max_tokens, chars)

    @app.post("/v1/completions", responses=ANSWERS)
    async def completions(body: CompletionBody, request: Request):
        prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        if len(prompts) != 1:
            raise ApiError(400, "send one prompt per request", param="prompt")
        return await service.answer(COMPLETION, body, request, prompts[0], prompts[0], body.max_tokens, len(prompts[0]))


def _bank_routes(app: FastAPI, registry: BankRegistry) -> None:
    @app.put("/v1/banks/{name:path}", responses=errors(400, 401, 404, 409))
    async def put_bank(
        name: str,
        tensors: UploadFile = File(description="the bank's .safetensors"),
        metadata: UploadFile = File(description="the bank's .safetensors.json"),
    ):
        # in a worker thread: compiling the bank's tool schemas may take up to the server's schema budget
        version = await run_in_threadpool(registry.put, name, await tensors.read(), await metadata.read())
        return {"id": name, "object": "bank", "revision": version.revision, "procedures": version.model.bank.names}

    @app.delete("/v1/banks/{name:path}", responses=errors(400, 401, 404))
    def delete_bank(name: str):
        registry.delete(name)
        return {"id": name, "object": "bank", "deleted": True}


def _documented(app: FastAPI) -> None:
    """The OpenAPI document as the server answers: FastAPI's, without the 422 it lists for every route with a body
    or parameters (invalid requests get 400 here)."""
    generated = app.openapi

    def openapi() -> dict:
        document = generated()
        for operations in document["paths"].values():
            for operation in operations.values():
                operation["responses"].pop("422", None)
        for name in ("HTTPValidationError", "ValidationError"):
            document.get("components", {}).get("schemas", {}).pop(name, None)
        return document

    app.openapi = openapi


def _allowed(app: FastAPI, scope) -> list[str]:
    """The methods the app's routes take on the scope's path (a 405's Allow header)."""
    return sorted({m for r in app.routes if r.matches(scope)[0] != Match.NONE for m in getattr(r, "methods", ()) or ()})


UNKNOWN_FIELD = "not a field this server takes (see docs/serving.md for the OpenAI fields it implements)"
LOGGED = 300  # characters of a refusal's message that go to the server log


def _refused(request: Request, err: ApiError):
    """The error's response; a client's error (4xx) is logged with its message, which names the field."""
    if err.status < 500:
        log.warning("%s %s refused with %d: %s", request.method, request.url.path, err.status, err.message[:LOGGED])
    return err.response()


def _error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def refused(request, err: ApiError):
        return _refused(request, err)

    @app.exception_handler(TokMemError)
    async def tokmem_error(request, err: TokMemError):
        return _refused(request, api_error(err))

    @app.exception_handler(RequestValidationError)
    async def invalid(request, err: RequestValidationError):
        first = err.errors()[0]
        where = clipped(".".join(str(part) for part in first["loc"] if part != "body"), 120)
        message = UNKNOWN_FIELD if first["type"] == "extra_forbidden" else first["msg"]
        return _refused(request, ApiError(400, f"{where}: {message}" if where else message, param=where or None))

    @app.exception_handler(HTTPException)
    async def http_error(request, err: HTTPException):
        headers = {"Allow": ", ".join(_allowed(app, request.scope))} if err.status_code == 405 else err.headers
        return _refused(request, ApiError(err.status_code, str(err.detail), "invalid_request_error", headers=headers))

    @app.exception_handler(Exception)
    async def unexpected(request, err: Exception):
        log.error("unexpected %s on %s %s: %s", type(err).__name__, request.method, request.url.path, err)
        return ApiError(500, "the server failed on this request (see the server log)", "server_error").response()
