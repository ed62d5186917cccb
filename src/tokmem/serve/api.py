"""The HTTP API: OpenAI-compatible completions over banks, bank management, and the server's limits.

The ``model`` field of a request names the bank.  Answers are split into segments by
``tokmem.decode`` (memory tokens never reach ``content``); the routed procedures and the segments
come back in a ``tokmem`` field (of the response, or of the streamed chunk that carries
``finish_reason``).  Per-request extras ride in the body: ``procedure`` (force one, routing
skipped), ``threshold`` (the open-set rule), ``max_steps`` (segments per answer) and ``ignore_eos``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Literal

from fastapi import Depends, FastAPI, File, Request, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException

from tokmem.decode import DecodeConfig
from tokmem.errors import TokMemError
from tokmem.sequences import chat_prefix
from tokmem.serve.banks import BankNotFound, BankRegistry
from tokmem.serve.engine import Engine, Handle, Overloaded
from tokmem.serve.engine import Request as EngineRequest


@dataclass
class Limits:
    max_prompt_tokens: int = 2048
    max_new_tokens: int = 1024  # the most a request may ask for
    default_max_tokens: int = DecodeConfig.max_new_tokens  # when a request does not say
    max_body_bytes: int = 8 * 2**20
    timeout: float = 120.0  # seconds per request, queueing included


class ApiError(HTTPException):
    """An error answered with OpenAI's error body (an HTTPException, so FastAPI passes it through body parsing)."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", code: str | None = None, param: str | None = None):
        super().__init__(status, message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param

    def response(self) -> JSONResponse:
        body = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return JSONResponse({"error": body}, status_code=self.status)


# ---- request bodies ---------------------------------------------------------------------------------
class StreamOptions(BaseModel):
    include_usage: bool = False


class TokMemOptions(BaseModel):
    model: str = Field(description="the bank")
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(DecodeConfig.temperature, ge=0, le=2, description="0 (the default here) is greedy")
    n: int = Field(1, ge=1, le=1, description="one choice per request")
    stream: bool = False
    stream_options: StreamOptions | None = None
    procedure: str | None = Field(None, description="force this procedure (routing skipped)")
    threshold: float = Field(DecodeConfig.threshold, ge=0, description="open-set rule: the least memory mass that routes")
    max_steps: int = Field(DecodeConfig.max_steps, ge=1, description="most segments (memory tokens) per answer")
    ignore_eos: bool = Field(False, description="go on past EOS up to max_tokens (benchmarking)")


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class Message(BaseModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class ChatBody(TokMemOptions):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)


class CompletionBody(TokMemOptions):
    prompt: str | list[str] = Field(description="the query (formatted with the backbone's chat template, as in training)")


# ---- response shapes ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    """How one endpoint's responses and streamed chunks look."""

    object: str
    chunk_object: str
    id_prefix: str
    chat: bool

    def choice(self, text: str | None, finish_reason: str | None, stream: bool) -> dict:
        choice = {"index": 0, "finish_reason": finish_reason, "logprobs": None}
        if not self.chat:
            return {**choice, "text": text or ""}
        if stream:
            return {**choice, "delta": {} if text is None else {"content": text}}
        return {**choice, "message": {"role": "assistant", "content": text}}


CHAT = Shape("chat.completion", "chat.completion.chunk", "chatcmpl", chat=True)
COMPLETION = Shape("text_completion", "text_completion", "cmpl", chat=False)


def usage(handle: Handle) -> dict:
    """True token counts: the prompt as encoded, and every generated token (memory tokens and EOS included)."""
    prompt, completion = len(handle.request.prompt), len(handle.tokens)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def tokmem_field(handle: Handle) -> dict:
    generation = handle.generation()
    return {
        "bank_revision": handle.request.bank.revision,
        "routed": generation.routed,
        "memory_mass": generation.memory_mass,
        "procedures": generation.procedures,
        "trace": [{"procedure": s.procedure, "text": s.text} for s in generation.trace],
    }


class Deltas:
    """Streamed text that is never taken back.

    Only what two successive decodings agree on goes out, short of trailing U+FFFD (a UTF-8 character
    still missing bytes); the rest goes when the answer is final.  Text that ``decode`` assembles
    around a segment may also change as tokens arrive.
    """

    def __init__(self):
        self.sent = self.previous = ""

    def update(self, text: str) -> str:
        stable, self.previous = os.path.commonprefix([self.previous, text]).rstrip("\ufffd"), text
        return self.final(stable)

    def final(self, text: str) -> str:
        if len(text) <= len(self.sent) or not text.startswith(self.sent):
            return ""
        delta, self.sent = text[len(self.sent) :], text
        return delta


def sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


# ---- the app ------------------------------------------------------------------------------------------
def create_app(registry: BankRegistry, engine: Engine, limits: Limits | None = None, api_key: str | None = None) -> FastAPI:
    limits = limits or Limits()

    @asynccontextmanager
    async def lifespan(app):
        engine.start()
        yield
        engine.stop()

    app = FastAPI(title="tokmem", lifespan=lifespan)
    app.add_middleware(BodyLimit, limit=limits.max_body_bytes)
    _error_handlers(app)

    def authorized(request: Request) -> None:
        """Bank management needs ``Authorization: Bearer KEY`` when the server has an API key."""
        given = request.headers.get("authorization", "")
        if api_key and not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            raise ApiError(401, "bank management needs the header 'Authorization: Bearer <api key>'", "authentication_error")

    @app.get("/health")
    def health():
        return {"status": "ok", "backbone": registry.backbone.name, "resident_banks": registry.resident,
                "running": engine.running, "queued": len(engine.pending)}

    @app.get("/v1/models")
    def models():
        data = []
        for name in registry.names():
            try:
                created = int(registry.path(name).stat().st_mtime)
            except FileNotFoundError:  # deleted meanwhile
                continue
            data.append({"id": name, "object": "model", "created": created, "owned_by": "tokmem", "parent": registry.backbone.name})
        return {"object": "list", "data": data}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatBody, request: Request):
        if body.messages[-1].role != "user":
            raise ApiError(400, "the last message must be the user's", param="messages")
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        max_tokens = body.max_completion_tokens or body.max_tokens
        return await answer(CHAT, body, request, messages, messages[-1]["content"], max_tokens)

    @app.post("/v1/completions")
    async def completions(body: CompletionBody, request: Request):
        prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        if len(prompts) != 1:
            raise ApiError(400, "send one prompt per request", param="prompt")
        return await answer(COMPLETION, body, request, prompts[0], prompts[0], body.max_tokens)

    @app.put("/v1/banks/{name:path}", dependencies=[Depends(authorized)])
    async def put_bank(name: str, tensors: UploadFile = File(description="the bank's .safetensors"),
                       metadata: UploadFile = File(description="the bank's .safetensors.json")):
        # validating and writing a bank of kilobytes takes about a millisecond: done here, not in a worker thread,
        # whose hand-offs cost more than the work when the machine is busy
        version = registry.put(name, await tensors.read(), await metadata.read())
        return {"id": name, "object": "bank", "revision": version.revision, "procedures": version.model.bank.names}

    @app.delete("/v1/banks/{name:path}", dependencies=[Depends(authorized)])
    def delete_bank(name: str):
        registry.delete(name)
        return {"id": name, "object": "bank", "deleted": True}

    async def answer(shape: Shape, body: TokMemOptions, request: Request, query, text: str, max_tokens: int | None):
        handle = await submit(body, query, text, max_tokens)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(stream(shape, body.model, handle, request, include_usage), media_type="text/event-stream")
        await wait_for_answer(handle, request)
        _raise_unfinished(handle, limits)
        generation = handle.generation()
        return {
            "id": _id(shape), "object": shape.object, "created": int(time.time()), "model": body.model,
            "choices": [shape.choice(generation.text, handle.finish_reason, stream=False)],
            "usage": usage(handle), "tokmem": tokmem_field(handle),
        }

    async def submit(body: TokMemOptions, query, text: str, max_tokens: int | None) -> Handle:
        max_tokens = max_tokens or min(limits.default_max_tokens, limits.max_new_tokens)
        if max_tokens > limits.max_new_tokens:
            raise ApiError(400, f"max_tokens is {max_tokens}; this server allows at most {limits.max_new_tokens}", param="max_tokens")
        bank = await run_in_threadpool(registry.get, body.model)
        prompt = chat_prefix(registry.backbone.tokenizer, query)
        if len(prompt) > limits.max_prompt_tokens:
            raise ApiError(400, f"the prompt has {len(prompt)} tokens; this server allows at most {limits.max_prompt_tokens}",
                           code="context_length_exceeded")
        forced = -1 if body.procedure is None else bank.model.memory_id(body.procedure)
        return engine.submit(EngineRequest(
            bank, prompt, text, max_tokens=max_tokens, max_steps=body.max_steps, threshold=body.threshold,
            temperature=body.temperature, forced=forced, ignore_eos=body.ignore_eos, timeout=limits.timeout,
        ))

    async def stream(shape: Shape, model: str, handle: Handle, request: Request, include_usage: bool) -> AsyncIterator[str]:
        meta = {"id": _id(shape), "object": shape.chunk_object, "created": int(time.time()), "model": model}
        deltas = Deltas()
        watcher = asyncio.create_task(_cancel_on_disconnect(request, handle))
        try:
            if shape.chat:
                yield sse({**meta, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
            while not handle.finished:
                await handle.updated()
                piece = deltas.update(handle.generation(list(handle.tokens)).text)
                if piece:
                    yield sse({**meta, "choices": [shape.choice(piece, None, stream=True)]})
            try:
                _raise_unfinished(handle, limits)
            except ApiError as err:
                yield sse({"error": {"message": err.message, "type": err.type, "param": None, "code": err.code}})
                return
            last = shape.choice(deltas.final(handle.generation().text) or None, handle.finish_reason, stream=True)
            yield sse({**meta, "choices": [last], "tokmem": tokmem_field(handle)})
            if include_usage:
                yield sse({**meta, "choices": [], "usage": usage(handle)})
            yield sse("[DONE]")
        finally:
            watcher.cancel()
            handle.cancel()  # frees the row if the client went away mid-answer

    return app


async def wait_for_answer(handle: Handle, request: Request) -> None:
    """Wait for the answer; a client that goes away meanwhile frees its row."""
    watcher = asyncio.create_task(_cancel_on_disconnect(request, handle))
    try:
        while not handle.finished:
            await handle.updated()
    finally:
        watcher.cancel()


async def _cancel_on_disconnect(request: Request, handle: Handle) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    handle.cancel()


def _raise_unfinished(handle: Handle, limits: Limits) -> None:
    if handle.finish_reason == "timeout":
        raise ApiError(504, f"the answer took longer than the server's limit of {limits.timeout:g} s", "timeout")
    if handle.finish_reason == "error":
        raise ApiError(500, "the decoding step failed (see the server log)", "server_error")


def _id(shape: Shape) -> str:
    return f"{shape.id_prefix}-{uuid.uuid4().hex}"


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes with 413, by Content-Length or while reading."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await self._too_large().response()(scope, receive, send)
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise self._too_large()
            return message

        await self.app(scope, limited, send)

    def _too_large(self) -> ApiError:
        return ApiError(413, f"the request body is over this server's limit of {self.limit} bytes", code="request_too_large")


def _error_handlers(app: FastAPI) -> None:
    statuses = [(BankNotFound, 404, "model_not_found"), (Overloaded, 429, "overloaded"), (TokMemError, 400, None)]

    @app.exception_handler(ApiError)
    async def api_error(request, err: ApiError):
        return err.response()

    @app.exception_handler(TokMemError)
    async def tokmem_error(request, err: TokMemError):
        status, code = next((s, c) for kind, s, c in statuses if isinstance(err, kind))
        kind = "rate_limit_error" if status == 429 else "invalid_request_error"
        return ApiError(status, str(err), kind, code).response()

    @app.exception_handler(RequestValidationError)
    async def invalid(request, err: RequestValidationError):
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"] if part != "body")
        return ApiError(400, f"{where}: {first['msg']}" if where else first["msg"], param=where or None).response()

    @app.exception_handler(HTTPException)
    async def http_error(request, err: HTTPException):
        return ApiError(err.status_code, str(err.detail), "invalid_request_error").response()
