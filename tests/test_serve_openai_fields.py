"""The OpenAI fields agent frameworks send, in `tokmem serve`: `response_format` (the answer's JSON under the
schema), a client's tool `parameters` (the arguments under them), `top_p`, `stop`, `seed`, and several banks
composed for one request (`model: "tools+alpha"`), each against what it must equal."""

import asyncio
import json
import re

import openai
import pytest
import torch
from helpers import CITY, call, serve, write_bank, write_tool_bank

import tokmem
from tokmem import DecodeConfig
from tokmem.decoding.decode import nucleus

ASK = [{"role": "user", "content": "Weather in Rome, then count."}]
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "pattern": "^[A-Z][a-z]{0,11}$"},
        "days": {"type": "integer", "minimum": 0, "maximum": 9},
        "sunny": {"type": "boolean"},
    },
    "required": ["city", "days", "sunny"],
    "additionalProperties": False,
}
STRICT = {"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER, "strict": True}}


@pytest.fixture
def offline(lively_backbone, tmp_path):
    banks = tmp_path / "banks"
    return {
        "tools": write_tool_bank(lively_backbone, banks / "tools.safetensors"),
        "alpha": write_bank(lively_backbone, banks / "alpha.safetensors", rows=3, seed=1),  # rows unlike the tools'
        "again": write_tool_bank(lively_backbone, banks / "again.safetensors"),  # the same tool names as "tools"
    }


@pytest.fixture
def app(lively_backbone, tmp_path, offline):
    app, engine = serve(lively_backbone, tmp_path / "banks", max_new_tokens=300, max_prompt_tokens=400)
    engine.start()
    yield app
    engine.stop()


BANK_TOOLS = {"extra_body": {"bank_tools": True}}  # no tools listed, the bank's own callable (tokmem's opt-in)


def ask(app, *requests):
    """The served answers of chat ``requests`` (keyword dicts for ``chat.completions.create``), sent together."""

    async def scenario(client, http):
        return await asyncio.gather(
            *[client.chat.completions.create(**{"messages": ASK, "max_tokens": 60, **r}) for r in requests]
        )

    return call(app, scenario)


def answer(response) -> tuple:
    message = response.choices[0].message
    calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
    return message.content, calls, response.choices[0].finish_reason


# ---- response_format ------------------------------------------------------------------------------------
@pytest.mark.parametrize("bank", ["alpha", "tools"])
def test_a_json_schema_response_is_json_under_the_schema_and_json_object_an_object(app, bank):
    strict, loose, plain = ask(
        app,
        {"model": bank, "response_format": STRICT, "max_tokens": 300},
        {"model": bank, "response_format": {"type": "json_object"}, "max_tokens": 300},
        {"model": bank, "extra_body": {"threshold": 1.0}},  # the same bank's free text beside them
    )
    weather = json.loads(strict.choices[0].message.content)
    assert set(weather) == {"city", "days", "sunny"} and re.fullmatch("[A-Z][a-z]{0,11}", weather["city"])
    assert weather["days"] in range(10) and isinstance(weather["sunny"], bool)
    assert isinstance(json.loads(loose.choices[0].message.content), dict)
    assert strict.choices[0].finish_reason == loose.choices[0].finish_reason == "stop"
    assert plain.choices[0].message.content and not plain.choices[0].message.content.startswith("{")


def test_with_a_response_format_a_turn_may_still_call_a_tool_but_never_a_text_row(app):
    routed = {"threshold": 0.0}  # every turn that may route does
    tool, text = ask(
        app,
        {"model": "tools", "response_format": STRICT, "tool_choice": "required", "max_tokens": 200, **BANK_TOOLS},
        {"model": "alpha", "response_format": STRICT, "max_tokens": 300, "extra_body": routed},
    )
    (call_, *_) = tool.choices[0].message.tool_calls
    assert tool.choices[0].finish_reason == "tool_calls"
    assert call_.function.name == "count" or json.loads(call_.function.arguments)["city"] in ("Oslo", "Rome")
    assert not text.tokmem["routed"] and set(json.loads(text.choices[0].message.content)) == set(WEATHER["required"])


# ---- a client's tool schema -------------------------------------------------------------------------------
def test_a_clients_tool_parameters_bind_the_arguments_served_as_in_tokmem_chat(app, offline):
    only_rome = {**CITY, "properties": {"city": {"type": "string", "enum": ["Rome"]}}}
    tools = [{"type": "function", "function": {"name": "city", "parameters": only_rome, "strict": True}}]
    named = {"type": "function", "function": {"name": "city"}}
    bound, banks_own = ask(
        app,
        {"model": "tools", "tools": tools, "tool_choice": named, "max_tokens": 200},
        {"model": "tools", "tools": [{"type": "function", "function": {"name": "city"}}], "tool_choice": named},
    )
    assert [json.loads(c.function.arguments) for c in bound.choices[0].message.tool_calls] == [{"city": "Rome"}]
    assert json.loads(banks_own.choices[0].message.tool_calls[0].function.arguments)["city"] in ("Oslo", "Rome")
    reply = tokmem.chat(offline["tools"], ASK, tools, named, DecodeConfig(max_new_tokens=200))
    assert answer(bound) == (None, [(c.name, c.arguments) for c in reply.tool_calls], reply.finish_reason)


# ---- top_p, seed, stop ----------------------------------------------------------------------------------
def test_the_nucleus_keeps_the_most_probable_tokens_up_to_top_p():
    probs = torch.tensor([[0.1, 0.5, 0.3, 0.1], [0.25, 0.25, 0.25, 0.25]])
    kept = nucleus(probs, torch.tensor([0.7, 1.0])) > 0
    assert kept.tolist() == [[False, True, True, False], [True, True, True, True]]


def test_a_seeded_sampled_answer_is_the_same_alone_and_beside_other_requests(app):
    seeded = {"model": "alpha", "temperature": 1.0, "top_p": 0.9, "seed": 11, "extra_body": {"threshold": 0.0}}
    others = [{"model": "tools", "temperature": 1.0}, {"model": "alpha", "temperature": 0.7, "seed": 3}]
    (alone,) = ask(app, seeded)
    beside = ask(app, *others, seeded, *others)
    assert answer(beside[len(others)]) == answer(alone)


def test_a_tiny_top_p_samples_the_greedy_answer(app, offline):
    sampled, greedy = ask(
        app,
        {"model": "alpha", "temperature": 1.0, "top_p": 1e-6, "extra_body": {"threshold": 0.0}},
        {"model": "alpha", "extra_body": {"threshold": 0.0}},
    )
    assert answer(sampled) == answer(greedy)


def test_stop_ends_a_text_answer_before_the_sequence_plain_and_streamed(app, offline):
    reference = tokmem.generate(offline["alpha"], [ASK[0]["content"]], DecodeConfig(max_new_tokens=60, threshold=1.0))
    text = reference[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    request = {"model": "alpha", "stop": [stop, "never said"], "extra_body": {"threshold": 1.0}}

    async def scenario(client, http):
        whole = await client.chat.completions.create(messages=ASK, max_tokens=60, **request)
        stream = await client.chat.completions.create(messages=ASK, max_tokens=60, stream=True, **request)
        chunks = [chunk async for chunk in stream]
        return whole, chunks

    whole, chunks = call(app, scenario)
    assert whole.choices[0].message.content == text[: text.index(stop)]
    assert whole.choices[0].finish_reason == "stop" and whole.usage.completion_tokens < 60
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text[: text.index(stop)]


# ---- several banks in one request ------------------------------------------------------------------------
def test_composed_banks_answer_a_tool_turn_as_the_tools_bank_alone(app, offline):
    tools = [{"type": "function", "function": {"name": name}} for name in ("city", "count")]
    for choice in ("required", {"type": "function", "function": {"name": "count"}}):
        composed, alone, reversed_ = ask(
            app,
            *[
                {"model": model, "tools": tools, "tool_choice": choice, "max_tokens": 200}
                for model in ("tools+alpha", "tools", "alpha+tools")
            ],
        )
        assert answer(composed) == answer(alone) == answer(reversed_)
        assert composed.tokmem["bank_revision"] == "+".join(
            [alone.tokmem["bank_revision"], reversed_.tokmem["bank_revision"].split("+")[0]]
        )


def test_composed_banks_equal_tokmem_chat_on_the_composed_model(app, offline):
    (served,) = ask(
        app, {"model": "alpha+tools", "max_tokens": 200, "extra_body": {"threshold": 0.0, "bank_tools": True}}
    )
    model = tokmem.compose([offline["alpha"], offline["tools"]])
    reply = tokmem.chat(model, ASK, config=DecodeConfig(max_new_tokens=200, threshold=0.0))
    assert answer(served) == (reply.content, [(c.name, c.arguments) for c in reply.tool_calls], reply.finish_reason)
    assert model.bank.names == ["p0", "p1", "p2", "city", "count", "chat"]


@pytest.mark.parametrize(
    "model, status, message",
    [
        ("tools+again", 400, "cannot compose 'tools' and 'again': both have 'city', 'count', 'chat'"),
        ("tools+nope", 404, "no bank named 'nope'"),
        ("tools+", 400, "invalid bank name ''"),
        ("+".join(["alpha"] * 17), 400, "at most 16 banks"),
    ],
)
def test_a_composition_that_cannot_be_made_is_refused_naming_why(app, model, status, message):
    async def scenario(client, http):
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(model=model, messages=ASK, max_tokens=5)
        return caught.value

    error = call(app, scenario)
    assert error.status_code == status and message in error.body["message"]


@pytest.mark.parametrize(
    "request_body, message",
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}}},
            "response_format.json_schema.schema",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "city", "parameters": {**CITY, "$ref": "#/$defs/Nowhere"}},
                    }
                ]
            },
            "tools['city'].parameters",
        ),
    ],
    ids=["response-format", "tool-parameters"],
)
def test_a_request_schema_that_cannot_compile_is_that_requests_400_and_others_answer(app, request_body, message):
    async def scenario(client, http):
        bad = client.chat.completions.create(model="tools", messages=ASK, max_tokens=5, **request_body)
        clean = client.chat.completions.create(model="tools", messages=ASK, max_tokens=5)
        return await asyncio.gather(bad, clean, return_exceptions=True)

    bad, clean = call(app, scenario)
    assert isinstance(bad, openai.BadRequestError) and message in bad.body["message"]
    assert clean.choices[0].finish_reason in ("stop", "length", "tool_calls")
