"""The wire format: OpenAI-compatible request bodies (validated at the door), response shapes, error bodies.

Every field a client sends is bounded here, so that nothing past the door meets a value it cannot take:
temperatures are 0 (greedy) or at least ``MIN_TEMPERATURE``, integers have upper bounds, floats are
finite, and every string must be encodable as UTF-8 (a lone surrogate such as ``"\\ud800"`` is refused
with 400 rather than reaching the tokenizer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi.responses import JSONResponse
from pydantic import AfterValidator, BaseModel, Field, field_validator
from starlette.exceptions import HTTPException

from tokmem.decode import DecodeConfig

MIN_TEMPERATURE = 0.01  # below it (except 0, greedy) sampling is greedy in all but name, and scaled logits overflow
MAX_STEPS = 64  # segments (memory tokens) per answer
MAX_INT = 2**31 - 1  # the largest integer a client may send anywhere


def _utf8(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"the text is not valid Unicode ({err.reason} at character {err.start})") from None
    return text


Text = Annotated[str, AfterValidator(_utf8)]


class ApiError(HTTPException):
    """An error answered with OpenAI's error body (an HTTPException, so FastAPI passes it through body parsing)."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None, headers: dict | None = None):
        super().__init__(status, message, headers)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


# ---- request bodies ---------------------------------------------------------------------------------
class StreamOptions(BaseModel):
    include_usage: bool = False


class TokMemOptions(BaseModel):
    model: Text = Field(description="the bank", max_length=200)
    max_tokens: int | None = Field(None, ge=1, le=MAX_INT)
    temperature: float = Field(DecodeConfig.temperature, ge=0, le=2, allow_inf_nan=False,
                               description=f"0 (the default here) is greedy; else at least {MIN_TEMPERATURE}")
    n: int = Field(1, ge=1, le=1, description="one choice per request")
    stream: bool = False
    stream_options: StreamOptions | None = None
    procedure: Text | None = Field(None, max_length=200, description="force this procedure (routing skipped)")
    threshold: float = Field(DecodeConfig.threshold, ge=0, le=1, allow_inf_nan=False, description="open-set rule: the least memory mass that routes")
    max_steps: int = Field(DecodeConfig.max_steps, ge=1, le=MAX_STEPS, description="most segments (memory tokens) per answer")
    ignore_eos: bool = Field(False, description="go on past EOS up to max_tokens (benchmarking)")

    @field_validator("temperature")
    @classmethod
    def _greedy_or_sampled(cls, value: float) -> float:
        if 0 < value < MIN_TEMPERATURE:
            raise ValueError(f"use 0 (greedy) or at least {MIN_TEMPERATURE}")
        return value


class TextPart(BaseModel):
    type: Literal["text"]
    text: Text


class Message(BaseModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: Text | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class ChatBody(TokMemOptions):
    messages: list[Message] = Field(min_length=1, max_length=1000)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_INT)


class CompletionBody(TokMemOptions):
    prompt: Text | list[Text] = Field(description="the query (formatted with the backbone's chat template, as in training)")


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
