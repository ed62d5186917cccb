"""The serving layer behind the completion routes: a request's limits, tokenising, routing masks and schema grammars,
its submission to the engine, time limits, streaming and retries (``CompletionService``), each answer shaped as
OpenAI's.

The routes (``api``) parse and validate the bodies (``protocol``) and hand them here; the one decoding loop is the
engine's (``engine``).  Every request ends with an answer or an OpenAI error body: a request the engine fails gets 500
with the reason, the others are untouched; and a request whose answer the engine never finishes (it should not
happen) is cancelled shortly after its time limit with 504.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import torch
from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from tokmem.decoding.tool_rules import Reply, reply_from, starts_calls, without_repeats
from tokmem.decoding.conversation import conversation_ids
from tokmem.errors import TokMemError
from tokmem.training.sequences import chat_prefix
from tokmem.serve.banks import BankConflict, BankNotFound, BankRegistry, BankUnusable, BankVersion, BankWriteError
from tokmem.serve.config import ServeConfig
from tokmem.serve.engine import Engine, Handle, Overloaded
from tokmem.serve.engine import Request as EngineRequest
from tokmem.serve.protocol import (
    ApiError,
    Shape,
    TokMemOptions,
)
from tokmem.serve.stream import CallDeltas, Deltas, IncrementalText, StopSequences

log = logging.getLogger(__name__)
GRACE = 5.0  # seconds past a request's time limit before the route stops waiting for the engine


class CompletionService:
    """Requests in, answers (whole or streamed) out."""

    def __init__(self, registry: BankRegistry, engine: Engine, config: ServeConfig):
        self.registry, self.engine, self.config = registry, engine, config

    async def answer(
        self,
        shape: Shape,
        body: TokMemOptions,
        request: Request,
        query: str | list[dict],
        text: str,
        max_tokens: int | None,
        chars: int,
    ):
        """``query``: the prompt (text completions) or the conversation (chat: its length numbers the call ids).
        A chat turn of nothing but calls already answered (``tokmem.decoding.tool_rules.without_repeats``) is decoded
        again without those tools; streamed, such a turn's calls go out once it is whole."""
        turn = len(query) if isinstance(query, list) else 1
        submission = Submission(self, body, query, text, max_tokens, chars, body.answered(query))
        handle = await submission.send()
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(
                self.stream(shape, body.model, submission, handle, request, include_usage, turn),
                media_type="text/event-stream",
            )
        await self.wait(handle, request)
        self.raise_unfinished(handle)
        if shape.chat:
            reply, handle = await self.reply_without_repeats(submission, handle, request, turn)
            choice = shape.choice(reply.content, reply.finish_reason, False, [c.to_openai() for c in reply.tool_calls])
        else:
            choice = shape.choice(_text(handle), handle.finish_reason, stream=False)
        return {
            "id": _id(shape),
            "object": shape.object,
            "created": int(time.time()),
            "model": body.model,
            "choices": [choice],
            "usage": usage(handle),
            "tokmem": tokmem_field(handle),
        }

    async def reply_without_repeats(
        self, submission: "Submission", handle: Handle, request: Request, turn: int
    ) -> tuple[Reply, Handle]:
        """The finished chat answer of ``handle`` without repeated calls, decoding the turn again (and waiting) while
        it is nothing but repeats; with the handle that answered."""
        while True:
            reply, repeated = without_repeats(_reply(handle, turn), submission.answered, turn)
            if not repeated:
                return reply, handle
            handle = await submission.send(repeated)
            await self.wait(handle, request)
            self.raise_unfinished(handle)

    async def submit(
        self,
        body: TokMemOptions,
        query: str | list[dict],
        text: str,
        max_tokens: int | None,
        chars: int,
        masked: frozenset[str] = frozenset(),
    ) -> Handle:
        """The request, checked against the server's limits, in the engine's queue; ``masked``: tools (bank rows) the
        answer may not use."""
        config = self.config
        max_tokens = max_tokens or min(config.default_max_tokens, config.max_new_tokens)
        if max_tokens > config.max_new_tokens:
            raise ApiError(
                400,
                f"max_tokens is {max_tokens}; this server allows at most {config.max_new_tokens}",
                param="max_tokens",
            )
        if chars > config.max_prompt_chars:
            raise ApiError(
                400,
                f"the prompt has {chars} characters; this server allows at most {config.max_prompt_chars}",
                code="context_length_exceeded",
            )
        bank = await run_in_threadpool(self.registry.get, body.model)
        prompt = await run_in_threadpool(_prompt, bank.model, query)
        if len(prompt) > config.max_prompt_tokens:
            raise ApiError(
                400,
                f"the prompt has {len(prompt)} tokens; this server allows at most {config.max_prompt_tokens}",
                code="context_length_exceeded",
            )
        allowed, forced, threshold = body.routing(bank.model, config.bank_tools)
        if masked:
            allowed = allowed & torch.tensor([n not in masked for n in bank.model.bank.names], device=allowed.device)
        references = isinstance(query, str)  # a chat answers as tokmem.chat: arguments are values
        tools, response = await run_in_threadpool(self._grammars, body, bank, references)
        return self.engine.submit(
            EngineRequest(
                bank,
                prompt,
                text,
                max_tokens=max_tokens,
                max_steps=body.steps(),
                threshold=threshold,
                temperature=body.temperature,
                top_p=body.top_p,
                seed=body.seed,
                stop=StopSequences(body.stop),
                forced=forced,
                ignore_eos=body.ignore_eos,
                timeout=config.timeout,
                allowed=allowed,
                schema=body.bind_schema,
                grammars=tools,
                response=response,
                references=references,
            )
        )

    def _grammars(self, body: TokMemOptions, bank: BankVersion, references: bool) -> tuple[list | None, object]:
        """The request's own grammars, compiled before it reaches the engine (within the server's schema budget):
        its tools' arguments under the client's ``parameters`` (None: the bank's), its whole response's (None: free
        text).  A schema that cannot compile is this request's 400 (``SchemaError``, naming the field)."""
        grammars, names = self.registry.grammars, bank.model.bank.names
        schemas = body.tool_schemas(bank.model)
        fields, key_sets = [f"tools['{n}'].parameters" for n in names], bank.model.bank.key_sets
        tools = schemas and grammars.rows(schemas, references, fields=fields, key_sets=key_sets)
        schema = body.response_schema()
        return tools, None if schema is None else grammars.compile(schema, "response_format.json_schema.schema")

    async def wait(self, handle: Handle, request: Request) -> None:
        """Wait for the answer; a client that goes away meanwhile frees its row."""
        watcher = asyncio.create_task(_cancel_on_disconnect(request, handle))
        try:
            await asyncio.wait_for(_finished(handle), self.config.timeout + GRACE)
        except TimeoutError:
            log.error("the engine did not finish a request within its time limit; cancelled")
            handle.cancel()
        finally:
            watcher.cancel()

    async def stream(
        self,
        shape: Shape,
        model: str,
        submission: "Submission",
        handle: Handle,
        request: Request,
        include_usage: bool,
        turn: int,
    ) -> AsyncIterator[str]:
        meta = {"id": _id(shape), "object": shape.chunk_object, "created": int(time.time()), "model": model}
        deltas, calls = Deltas(), CallDeltas(turn)
        hold = bool(submission.answered)  # a call may repeat an answered one: calls go out once the turn is whole
        try:
            if shape.chat:  # no content yet: the answer may be tool calls (content null, as OpenAI's)
                yield sse({**meta, "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]})
            while True:
                async for chunk in self._pieces(shape, meta, handle, request, deltas, calls, hold):
                    yield chunk
                self.raise_unfinished(handle)
                if not shape.chat:
                    last = shape.choice(deltas.final(_text(handle)) or None, handle.finish_reason, stream=True)
                    break
                reply, repeated = without_repeats(_reply(handle, turn), submission.answered, turn)
                if not repeated:
                    rest = calls.final([(c.name, c.arguments) for c in reply.tool_calls])
                    last = shape.choice(deltas.final(reply.content or "") or None, reply.finish_reason, True, rest)
                    break
                handle = await submission.send(repeated)  # nothing of the repeats went out: decode the turn again
            yield sse({**meta, "choices": [last], "tokmem": tokmem_field(handle)})
            if include_usage:
                yield sse({**meta, "choices": [], "usage": usage(handle)})
            yield sse("[DONE]")
        except (ApiError, TokMemError) as err:  # a turn decoded again may be refused (a full queue, a bank gone)
            yield sse((err if isinstance(err, ApiError) else api_error(err)).body())
        finally:
            handle.cancel()  # frees the row if the client went away mid-answer

    async def _pieces(
        self, shape: Shape, meta: dict, handle: Handle, request: Request, deltas: Deltas, calls: CallDeltas, hold: bool
    ) -> AsyncIterator[str]:
        """The chunks of ``handle``'s answer as its tokens arrive, until it finishes (or its time is up); ``hold``:
        a chat's tool calls wait for the whole turn."""
        bank, text = handle.request.bank.model, IncrementalText(handle.request.bank.model)
        watcher = asyncio.create_task(_cancel_on_disconnect(request, handle))
        deadline = time.monotonic() + self.config.timeout + GRACE
        try:
            while not handle.finished and time.monotonic() < deadline:
                await _updated(handle, deadline - time.monotonic())
                tokens = handle.tokens
                if shape.chat and tokens and starts_calls(bank, tokens[0], handle.plain):
                    piece = [] if hold else calls.update(text.calls(tokens))
                    if piece:
                        yield sse({**meta, "choices": [shape.choice(None, None, True, piece)]})
                else:
                    piece = deltas.update(handle.request.stop.cut(text.update(tokens), final=False))
                    if piece:
                        yield sse({**meta, "choices": [shape.choice(piece, None, stream=True)]})
        finally:
            watcher.cancel()

    def raise_unfinished(self, handle: Handle) -> None:
        if not handle.finished or handle.finish_reason == "timeout":
            raise ApiError(
                504, f"the answer took longer than the server's limit of {self.config.timeout:g} s", "timeout"
            )
        if handle.finish_reason == "error":
            raise ApiError(500, handle.error or "the request failed (see the server log)", "server_error")


@dataclass
class Submission:
    """What a request asks, kept to submit its turn again: with tools masked when a chat turn was nothing but calls
    already ``answered`` (``tokmem.decoding.tool_rules.without_repeats``)."""

    service: CompletionService
    body: TokMemOptions
    query: str | list[dict]
    text: str
    max_tokens: int | None
    chars: int
    answered: set[tuple[str, str]]
    masked: frozenset[str] = frozenset()

    async def send(self, repeated: list[str] = ()) -> Handle:
        self.masked |= frozenset(repeated)
        return await self.service.submit(self.body, self.query, self.text, self.max_tokens, self.chars, self.masked)


def _prompt(model, query: str | list[dict]) -> list[int]:
    """The prompt's token ids: a text completion's query through the chat template, a chat as ``tokmem.chat``
    lays out a conversation (tool calls and results included)."""
    return chat_prefix(model.backbone.tokenizer, query) if isinstance(query, str) else conversation_ids(model, query)


def _reply(handle: Handle, turn: int) -> Reply:
    """The chat answer (``tokmem.chat``'s ``Reply``, its text up to a stop sequence); a request the engine ended
    early keeps the engine's reason."""
    reply = reply_from(handle.request.bank.model, handle.tokens, handle.plain, turn)
    if reply.content is not None:
        reply.content = handle.request.stop.cut(reply.content)
    ended_early = handle.finish_reason not in ("stop", "length")
    stop_sequence = handle.finish_reason == "stop" and reply.finish_reason == "length"  # no EOS: a stop sequence
    if ended_early or stop_sequence:
        reply.finish_reason = handle.finish_reason
    return reply


def _text(handle: Handle) -> str:
    """A text completion's answer, up to a stop sequence."""
    return handle.request.stop.cut(handle.generation().text)


async def _finished(handle: Handle) -> None:
    while not handle.finished:
        await handle.updated()


async def _updated(handle: Handle, seconds: float) -> None:
    try:
        await asyncio.wait_for(handle.updated(), max(0.0, seconds))
    except TimeoutError:
        handle.cancel()


async def _cancel_on_disconnect(request: Request, handle: Handle) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    handle.cancel()


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


def sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


def _id(shape: Shape) -> str:
    return f"{shape.id_prefix}-{uuid.uuid4().hex}"


STATUSES_OF_ERRORS = [  # (a tokmem error, its status, its code): the first that matches
    (BankNotFound, 404, "model_not_found"),
    (BankConflict, 409, "bank_conflict"),
    (Overloaded, 429, "overloaded"),
    (BankUnusable, 500, "bank_unusable"),
    (BankWriteError, 500, "bank_not_written"),
    (TokMemError, 400, None),
]


def api_error(err: TokMemError) -> ApiError:
    """The OpenAI error a tokmem error answers with."""
    status, code = next((s, c) for kind, s, c in STATUSES_OF_ERRORS if isinstance(err, kind))
    kind = {429: "rate_limit_error", 500: "server_error"}.get(status, "invalid_request_error")
    return ApiError(status, str(err), kind, code)
