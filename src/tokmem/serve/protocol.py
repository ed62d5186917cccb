"""The wire format: OpenAI-compatible request bodies (validated at the door), response shapes, error bodies.

Every field a client sends is bounded here, so that nothing past the door meets a value it cannot take:
temperatures are 0 (greedy) or at least ``MIN_TEMPERATURE``, integers have upper bounds, floats are
finite, and every string must be encodable as UTF-8 (a lone surrogate such as ``"\\ud800"`` is refused
with 400 rather than reaching the tokenizer).

OpenAI's tools API: ``tools`` (function tools: the bank's tool rows of those names, their ``parameters`` binding the
arguments: ``tokmem.decoding.tool_rules.tool_schemas``), ``tool_choice``, ``parallel_tool_calls`` (false: at most one
call a turn, i.e. one memory token), assistant messages with ``tool_calls`` and ``role: "tool"`` results;
``response_format`` (``json_object`` / ``json_schema``: the answer's text decodes under the schema), ``top_p``,
``stop``, ``seed``.  The OpenAI fields in ``OFF`` are not implemented: a request may send them only with the value that
leaves them off, anything else is a 400 naming the field, never ignored.  ``IGNORED`` fields are OpenAI's metadata about
a request (this server stores nothing): accepted, without effect.  Any other field is a 400 naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
from fastapi.responses import JSONResponse
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationInfo,
    field_validator,
    model_validator,
)
from starlette.exceptions import HTTPException

from tokmem.decoding.tool_rules import answered_calls, tool_routing, tool_schemas
from tokmem.errors import DataError, clipped
from tokmem.decoding.decode import DecodeConfig, open_set_threshold

MIN_TEMPERATURE = 0.01  # below it (except 0, greedy) sampling is greedy in all but name, and scaled logits overflow
MAX_STEPS = 64  # segments (memory tokens) per answer
MAX_INT = 2**31 - 1  # the largest integer a client may send anywhere
NAME = 200  # the longest bank, procedure or tool name (and tool call id)
MAX_STOPS = 4  # stop sequences per request (as OpenAI)
MAX_MESSAGE = 2000  # the longest error message (what it echoes of the input is cut before, see errors.clipped)
# the OpenAI fields this server does not implement, and the values that leave them off (the only ones accepted)
OFF = {
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "frequency_penalty": (None, 0),
    "presence_penalty": (None, 0),
    "logit_bias": (None, {}),
    "service_tier": (None, "auto", "default"),
    "functions": (None,),
    "function_call": (None,),
}
LEGACY = {"functions": "tools", "function_call": "tool_choice"}  # OpenAI's deprecated fields and what replaced them
IGNORED = ("user", "metadata", "store")  # OpenAI's metadata about a request: accepted, without effect


def _utf8(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"the text is not valid Unicode ({err.reason} at character {err.start})") from None
    return text


Text = Annotated[str, AfterValidator(_utf8)]


class ApiError(HTTPException):
    """An error answered with OpenAI's error body (an HTTPException, so FastAPI passes it through body parsing)."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict | None = None,
    ):
        super().__init__(status, message, headers)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param

    def body(self) -> dict:
        message, param = clipped(self.message, MAX_MESSAGE), None if self.param is None else clipped(self.param)
        return {"error": {"message": message, "type": self.type, "param": param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """OpenAI's error body: every answer other than 200 has it."""

    error: ErrorDetail


# ---- request bodies ---------------------------------------------------------------------------------
class StreamOptions(BaseModel):
    include_usage: bool = False


class JsonSchemaFormat(BaseModel):
    name: Text = Field(max_length=NAME)
    description: Text | None = None
    schema_: dict[str, JsonValue] = Field(
        {"type": "object"}, alias="schema", description="the JSON schema the answer's text decodes under"
    )
    strict: bool | None = None


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> "ResponseFormat":
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema is given with type 'json_schema', and only then")
        return self

    def answer_schema(self) -> dict | None:
        """The schema the answer's text decodes under (any JSON object for ``json_object``), or None (text)."""
        if self.type == "text":
            return None
        return {"type": "object"} if self.json_schema is None else self.json_schema.schema_


class TokMemOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a field this server does not know is refused by name, never ignored

    model: Text = Field(
        description="the bank, or several banks of the backbone joined by '+' (their rows together)", max_length=1000
    )
    max_tokens: int | None = Field(None, ge=1, le=MAX_INT)
    temperature: float = Field(
        DecodeConfig.temperature,
        ge=0,
        le=2,
        allow_inf_nan=False,
        description=f"0 (the default here) is greedy; else at least {MIN_TEMPERATURE}",
    )
    top_p: float = Field(1.0, gt=0, le=1, allow_inf_nan=False, description="nucleus sampling (temperature > 0)")
    seed: int | None = Field(
        None, ge=-(2**63), lt=2**64, description="sampling seed: the same request samples the same answer"
    )
    stop: Text | list[Text] | None = Field((), description=f"up to {MAX_STOPS} sequences that end a text answer")
    n: int | None = Field(1, description="one choice per request")
    stream: bool = False
    stream_options: StreamOptions | None = None
    procedure: Text | None = Field(None, max_length=200, description="force this procedure (routing skipped)")
    threshold: float | None = Field(
        None,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="open-set rule: the least memory mass that routes (default: the bank's, else 0.5)",
    )
    max_steps: int = Field(
        DecodeConfig.max_steps, ge=1, le=MAX_STEPS, description="most segments (memory tokens) per answer"
    )
    ignore_eos: bool = Field(False, description="go on past EOS up to max_tokens (benchmarking)")
    bind_schema: bool = Field(
        DecodeConfig.schema,
        alias="schema",
        description="decode a tool's arguments under its JSON schema, where the bank has one",
    )
    user: Text | None = Field(None, max_length=NAME, description="accepted, without effect (OpenAI's metadata)")
    metadata: dict[str, Text] | None = Field(
        None, max_length=16, description="accepted, without effect (OpenAI's metadata)"
    )
    store: bool | None = Field(None, description="accepted, without effect: this server stores nothing")
    # not implemented (``OFF``): typed as OpenAI types them, refused unless off
    logprobs: bool | None = None
    top_logprobs: int | None = None
    frequency_penalty: float | None = Field(None, allow_inf_nan=False)
    presence_penalty: float | None = Field(None, allow_inf_nan=False)
    logit_bias: dict[str, float] | None = None
    service_tier: Text | None = None
    functions: list[dict[str, JsonValue]] | None = Field(None, description="legacy: refused (send tools)")
    function_call: Text | dict[str, JsonValue] | None = Field(None, description="legacy: refused (send tool_choice)")

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int | None) -> int:
        if value not in (None, 1):
            raise ValueError("this server answers one choice per request: send n=1, or leave it out")
        return 1

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> tuple[str, ...]:
        stops = tuple(s for s in ([value] if isinstance(value, str) else value or []) if s)
        if len(stops) > MAX_STOPS or any(len(s) > NAME for s in stops):
            raise ValueError(f"send at most {MAX_STOPS} stop sequences of at most {NAME} characters each")
        return stops

    @field_validator("temperature")
    @classmethod
    def _greedy_or_sampled(cls, value: float) -> float:
        if 0 < value < MIN_TEMPERATURE:
            raise ValueError(f"use 0 (greedy) or at least {MIN_TEMPERATURE}")
        return value

    @field_validator(*OFF)
    @classmethod
    def _off(cls, value: Any, info: ValidationInfo) -> Any:
        if not any(value == off and isinstance(value, bool) == isinstance(off, bool) for off in OFF[info.field_name]):
            offs = " or ".join("null" if off is None else repr(off) for off in OFF[info.field_name])
            instead = (
                f"; it is the legacy form of {LEGACY[info.field_name]}: send that" if info.field_name in LEGACY else ""
            )
            raise ValueError(
                f"{info.field_name} is not supported by this server (send {offs}, or leave it out){instead}"
            )
        return value

    def routing(self, model, bank_tools: bool = False) -> tuple[Any, int, float]:
        """(allowed bank rows or None, forced memory id or -1, threshold): ``procedure`` forces one."""
        forced = -1 if self.procedure is None else model.memory_id(self.procedure)
        return None, forced, open_set_threshold(model.bank, self.threshold)

    def tool_schemas(self, model) -> list[dict | None] | None:
        """Per bank row, the schema its tool's arguments decode under; None: the bank's."""
        return None

    def response_schema(self) -> dict | None:
        """The schema the answer's text decodes under from its first token; None: free text."""
        return None

    def steps(self) -> int:
        return self.max_steps

    def answered(self, query) -> set[tuple[str, str]]:
        """The calls the answer may not repeat (``tokmem.decoding.tool_rules.answered_calls``): none for a text
        completion."""
        return set()


class TextPart(BaseModel):
    type: Literal["text"]
    text: Text


class FunctionCall(BaseModel):
    name: Text = Field(max_length=NAME)
    arguments: Text = Field(description="the call's arguments: a JSON object as text")


class ToolCall(BaseModel):
    id: Text = Field(max_length=NAME)
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = Field(None, max_length=MAX_STEPS)
    tool_call_id: Text | None = Field(None, max_length=NAME)

    @model_validator(mode="after")
    def _complete(self) -> "Message":
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only an assistant message may carry tool_calls")
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a 'tool' message needs the tool_call_id of the call it answers")
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content is required (only an assistant message with tool_calls may leave it out)")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)

    def chars(self) -> int:
        """The characters this message brings to the prompt (its text, its calls' names and arguments)."""
        return len(self.text()) + sum(len(c.function.name) + len(c.function.arguments) for c in self.tool_calls or [])

    def as_dict(self) -> dict:
        """The message as ``tokmem.chat`` takes it."""
        message = {"role": self.role, "content": self.text()}
        if self.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


class Function(BaseModel):
    name: Text = Field(max_length=NAME)
    description: Text | None = None
    parameters: dict[str, JsonValue] | None = Field(
        None, description="binds the arguments (over the names the bank's tool learned); absent: the bank's schema"
    )
    strict: bool | None = Field(None, description="the arguments always follow the schema, strict or not")


class Tool(BaseModel):
    type: Literal["function"]
    function: Function


class ToolName(BaseModel):
    name: Text = Field(max_length=NAME)


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: ToolName


class ChatBody(TokMemOptions):
    messages: list[Message] = Field(min_length=1, max_length=1000)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_INT)
    tools: list[Tool] | None = Field(
        None, max_length=4096, description="limit routing to the bank's tool rows of these names"
    )
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice = "auto"
    parallel_tool_calls: bool | None = Field(None, description="false: at most one tool call a turn")
    response_format: ResponseFormat | None = Field(
        None, description="json_object / json_schema: a text answer is JSON under the schema (text rows masked)"
    )
    bank_tools: bool | None = Field(
        None,
        description="without tools: whether the bank's own tools may be called (default: the server's --bank-tools, "
        "off: as OpenAI's API, a request that offers no tools gets no tool calls)",
    )

    @model_validator(mode="after")
    def _one_way_to_route(self) -> "ChatBody":
        if self.procedure is not None and (self.tools is not None or self.tool_choice != "auto"):
            raise ValueError("procedure (routing skipped) cannot be combined with tools or tool_choice")
        return self

    def routing(self, model, bank_tools: bool = False) -> tuple[Any, int, float]:
        """(allowed bank rows, forced memory id or -1, threshold) as ``tokmem.chat`` maps ``tools``/``tool_choice``;
        ``bank_tools``: the server's default for a request that offers no tools (``offered``)."""
        if self.procedure is not None:
            return super().routing(model)
        choice = self.tool_choice if isinstance(self.tool_choice, str) else self.tool_choice.model_dump()
        names = self.offered(bank_tools)
        if names == [] and choice == "required":
            raise DataError(
                "tool_choice 'required': the request offers no tools (list them in tools, or set bank_tools)"
            )
        allowed, forced, threshold = tool_routing(model, names, choice, self.threshold)
        if self.response_schema() is not None:  # the answer is tool calls or the response's JSON: no text row's words
            allowed = allowed & torch.tensor(
                [kind == "tool" for kind in model.bank.kinds], dtype=torch.bool, device=allowed.device
            )
        return allowed, forced, threshold

    def offered(self, bank_tools: bool) -> list[str] | None:
        """The tools the answer may call (None: all the bank's): those listed; without ``tools``, the one a named
        ``tool_choice`` names, or the bank's own where ``bank_tools`` (this request's, else the server's default),
        else none: a request that offers no tools gets no tool calls (its bank's text procedures still route)."""
        if self.tools is not None:
            return [tool.function.name for tool in self.tools]
        if isinstance(self.tool_choice, NamedToolChoice):
            return [self.tool_choice.function.name]
        return None if (bank_tools if self.bank_tools is None else self.bank_tools) else []

    def tool_schemas(self, model) -> list[dict | None] | None:
        return tool_schemas(model, [tool.model_dump(exclude_none=True) for tool in self.tools or []])

    def response_schema(self) -> dict | None:
        return None if self.response_format is None else self.response_format.answer_schema()

    def steps(self) -> int:
        """Segments the answer may hold: one where ``parallel_tool_calls`` is false or ``tool_choice`` names a tool
        (that call, once)."""
        one = self.parallel_tool_calls is False or isinstance(self.tool_choice, NamedToolChoice)
        return 1 if one else self.max_steps

    def answered(self, query: list[dict]) -> set[tuple[str, str]]:
        """The calls answered since the user's last message, when the model chooses its tools (no ``procedure``
        forced, ``tool_choice`` "auto")."""
        return set() if self.procedure is not None else answered_calls(query, self.tool_choice)


class CompletionBody(TokMemOptions):
    prompt: Text | list[Text] = Field(
        description="the query (formatted with the backbone's chat template, as in training)"
    )


# ---- response shapes ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    """How one endpoint's responses and streamed chunks look."""

    object: str
    chunk_object: str
    id_prefix: str
    chat: bool

    def choice(
        self, text: str | None, finish_reason: str | None, stream: bool, tool_calls: list[dict] | None = None
    ) -> dict:
        """One choice: ``tool_calls`` are OpenAI's (whole in a message, deltas in a streamed chunk)."""
        choice = {"index": 0, "finish_reason": finish_reason, "logprobs": None}
        if not self.chat:
            return {**choice, "text": text or ""}
        calls = {"tool_calls": tool_calls} if tool_calls else {}
        if stream:
            return {**choice, "delta": ({} if text is None else {"content": text}) | calls}
        return {**choice, "message": {"role": "assistant", "content": text} | calls}


CHAT = Shape("chat.completion", "chat.completion.chunk", "chatcmpl", chat=True)
COMPLETION = Shape("text_completion", "text_completion", "cmpl", chat=False)
