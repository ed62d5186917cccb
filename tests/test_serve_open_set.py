"""OpenAI's contract kept by `tokmem serve` whatever the bank would route: a request that offers no tools gets no
tool calls (its bank's text rows still route), `response_format` is honoured, the bank's own tools are callable
without listing them only by opting in (`bank_tools`, per request or `--bank-tools`), a named `tool_choice` is that
call once, and no turn holds the same call twice.  Tool rows here route every turn (threshold 0), so a call that
comes back is the contract broken, not the model's choice."""

import asyncio
import json

import openai
import pytest
from helpers import call, serve, write_tool_bank

from tokmem.decoding.tool_rules import Reply, ToolCall, call_id, without_repeats

ASK = [{"role": "user", "content": "Weather in Rome, then count."}]
ROUTE_ALWAYS = {"threshold": 0.0}
ANSWER = {
    "type": "json_schema",
    "json_schema": {
        "name": "answer",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
            "required": ["ok", "n"],
        },
    },
}


@pytest.fixture
def banks(lively_backbone, tmp_path):
    write_tool_bank(lively_backbone, tmp_path / "banks" / "tools.safetensors")
    return tmp_path / "banks"


def served(app, engine, *requests):
    async def scenario(client, http):
        return await asyncio.gather(
            *[
                client.chat.completions.create(**{"model": "tools", "messages": ASK, "max_tokens": 60, **r})
                for r in requests
            ]
        )

    engine.start()
    try:
        return call(app, scenario)
    finally:
        engine.stop()


def test_a_request_that_offers_no_tools_gets_no_tool_calls_even_where_every_turn_routes(lively_backbone, banks):
    app, engine = serve(lively_backbone, banks, max_prompt_tokens=400)
    plain, opted_in, listed = served(
        app,
        engine,
        {"extra_body": ROUTE_ALWAYS},
        {"extra_body": {**ROUTE_ALWAYS, "bank_tools": True}},
        {"extra_body": ROUTE_ALWAYS, "tools": [{"type": "function", "function": {"name": "count"}}]},
    )
    assert plain.choices[0].message.tool_calls is None and plain.choices[0].finish_reason != "tool_calls"
    assert plain.choices[0].message.content  # words: the bank's text row or the backbone
    assert opted_in.choices[0].message.tool_calls and listed.choices[0].message.tool_calls
    assert {c.function.name for c in listed.choices[0].message.tool_calls} == {"count"}


def test_the_servers_bank_tools_makes_a_banks_own_tools_callable_without_listing_them(lively_backbone, banks):
    app, engine = serve(lively_backbone, banks, max_prompt_tokens=400, bank_tools=True)
    default, opted_out = served(
        app, engine, {"extra_body": ROUTE_ALWAYS}, {"extra_body": {**ROUTE_ALWAYS, "bank_tools": False}}
    )
    assert default.choices[0].message.tool_calls and opted_out.choices[0].message.tool_calls is None


def test_a_response_format_without_tools_is_answered_as_json_under_its_schema(lively_backbone, banks):
    app, engine = serve(lively_backbone, banks, max_prompt_tokens=400)
    (answer,) = served(app, engine, {"response_format": ANSWER, "max_tokens": 40, "extra_body": ROUTE_ALWAYS})
    assert answer.choices[0].message.tool_calls is None
    assert set(json.loads(answer.choices[0].message.content)) == {"ok", "n"}


def test_a_named_tool_choice_is_that_call_once(lively_backbone, banks):
    app, engine = serve(lively_backbone, banks, max_prompt_tokens=400, max_new_tokens=256)
    named = {"type": "function", "function": {"name": "count"}}
    unlisted, listed = served(
        app,
        engine,
        {"tool_choice": named, "max_tokens": 200},
        {"tool_choice": named, "max_tokens": 200, "tools": [{"type": "function", "function": {"name": "count"}}]},
    )
    for response in (unlisted, listed):
        (only,) = response.choices[0].message.tool_calls
        assert only.function.name == "count" and response.choices[0].finish_reason == "tool_calls"
        assert isinstance(json.loads(only.function.arguments)["n"], int)


def test_required_without_tools_is_refused_naming_how_to_offer_them(lively_backbone, banks):
    app, engine = serve(lively_backbone, banks, max_prompt_tokens=400)

    async def scenario(client, http):
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model="tools", messages=ASK, tool_choice="required")
        return caught.value

    engine.start()
    try:
        error = call(app, scenario)
    finally:
        engine.stop()
    assert "tool_choice 'required'" in error.body["message"] and "bank_tools" in error.body["message"]


def test_a_turn_keeps_one_of_two_identical_calls_and_renumbers_the_rest():
    calls = [ToolCall("x", "city", '{"city": "Rome"}'), ToolCall("y", "city", '{ "city":"Rome" }')]
    calls.append(ToolCall("z", "count", '{"n": 2}'))
    reply, again = without_repeats(Reply(None, calls, "tool_calls"), set(), turn=3)
    assert again == [] and [(c.name, c.arguments) for c in reply.tool_calls] == [
        ("city", '{"city": "Rome"}'),
        ("count", '{"n": 2}'),
    ]
    assert [c.id for c in reply.tool_calls] == [call_id(3, 0), call_id(3, 1)]
