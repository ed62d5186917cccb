"""The OpenAI tools API in `tokmem serve`: served tool calls equal `tokmem.chat`'s offline answers, tools /
tool_choice / parallel_tool_calls mapped as `tokmem.chat` maps them, tool turns laid out as training lays them out,
the official `openai` SDK running a whole agent loop (plain and streamed), and what the server refuses by name."""

import asyncio
import json
from dataclasses import replace

import openai
import pytest
from helpers import CITY, COUNT, PINGED, call, ping_bank, serve, write_bank, write_tool_bank

import tokmem
from tokmem import DecodeConfig
from tokmem.decoding.conversation import conversation_ids
from tokmem.decoding.tool_rules import reply_from, tool_routing
from tokmem.training.sequences import chat_prefix
from tokmem.serve.banks import BankRegistry
from tokmem.serve.engine import Engine, Request

TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": schema}}
    for name, schema in (("city", CITY), ("count", COUNT))
]
CONFIG = DecodeConfig(max_new_tokens=200)  # room for the longest reference ("$var…$") the grammar allows to close
ASK = [{"role": "user", "content": "Weather in Rome, then count."}]


def tool_call(call_id, name, arguments) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


CONVERSATION = [
    *ASK,
    {"role": "assistant", "content": None, "tool_calls": [tool_call("a", "city", {"city": "Rome"})]},
    {"role": "tool", "tool_call_id": "a", "content": "sunny"},
]


def execute(name: str, arguments: dict) -> str:
    """Deterministic fake tools."""
    return {"city": lambda: f"sunny in {arguments.get('city')}", "count": lambda: f"{arguments.get('n')} apples"}[
        name
    ]()


@pytest.fixture
def offline(lively_backbone, tmp_path):
    """The served tool bank (two tools with schemas, one text row), a bank without tools and ``ping_bank``, as offline
    models."""
    model = write_tool_bank(lively_backbone, tmp_path / "banks" / "tools.safetensors")
    ping = ping_bank(lively_backbone)
    ping.bank.save(tmp_path / "banks" / "ping.safetensors")
    return {
        "tools": model,
        "alpha": write_bank(lively_backbone, tmp_path / "banks" / "alpha.safetensors", rows=3),
        "ping": ping,
    }


@pytest.fixture
def app(lively_backbone, tmp_path, offline):
    # bank_tools: a request that lists no tools may call the bank's, as tokmem.chat's tools=None (the default,
    # OpenAI's contract, is test_serve_open_set.py's)
    app, engine = serve(lively_backbone, tmp_path / "banks", max_new_tokens=256, max_prompt_tokens=400, bank_tools=True)
    engine.start()
    yield app
    engine.stop()


def served(response) -> tuple:
    """(content, tool calls as OpenAI dicts, finish_reason) of a served chat answer."""
    choice = response.choices[0]
    calls = [
        {"id": c.id, "type": c.type, "function": {"name": c.function.name, "arguments": c.function.arguments}}
        for c in choice.message.tool_calls or []
    ]  # the SDK's stream adds its own fields (index, parsed_arguments)
    return choice.message.content, calls, choice.finish_reason


def offline_reply(model, messages, config=CONFIG, **options) -> tuple:
    reply = tokmem.chat(model, messages, config=config, **options)
    return reply.content, [c.to_openai() for c in reply.tool_calls], reply.finish_reason


CASES = [
    ({}, {}),
    ({"tool_choice": "required"}, {"tool_choice": "required"}),
    ({"tool_choice": "none"}, {"tool_choice": "none"}),
    ({"tools": TOOLS[1:], "tool_choice": "required"}, {"tools": ["count"], "tool_choice": "required"}),
    (
        {"tool_choice": {"type": "function", "function": {"name": "city"}}},
        {"tool_choice": {"type": "function", "function": {"name": "city"}}},
    ),
    ({"tools": TOOLS}, {"tools": ["city", "count"]}),
]


FOLLOW_UP = [*CONVERSATION, {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "And in Oslo?"}]


@pytest.mark.parametrize(
    "messages", [ASK, CONVERSATION, FOLLOW_UP], ids=["first-turn", "after-a-tool-result", "the-user-goes-on"]
)
def test_served_answers_equal_tokmem_chat_for_each_tools_and_tool_choice_with_other_banks_in_flight(
    app, offline, messages
):
    async def scenario(client, http):
        answers = [
            client.chat.completions.create(model="tools", messages=messages, max_tokens=200, **request)
            for request, _ in CASES
        ]
        others = [
            client.chat.completions.create(model="alpha", messages=ASK, max_tokens=10, extra_body={"threshold": 0.0})
            for _ in range(3)
        ]
        return await asyncio.gather(*answers, *others)

    responses = call(app, scenario)
    for (_, options), response in zip(CASES, responses):
        assert served(response) == offline_reply(offline["tools"], messages, **options), options
    assert {served(r)[1][0]["function"]["name"] for r in responses[1:2] if served(r)[1]} <= {"city", "count"}
    reference = tokmem.generate(offline["alpha"], [ASK[0]["content"]], DecodeConfig(max_new_tokens=10, threshold=0.0))[
        0
    ]
    assert [r.choices[0].message.content for r in responses[len(CASES) :]] == [reference.text] * 3


def test_tool_calls_carry_ids_names_and_json_arguments_that_meet_the_tools_schema(app, offline):
    async def scenario(client, http):
        return await client.chat.completions.create(
            model="tools",
            messages=ASK,
            max_tokens=200,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "city"}},
        )

    response = call(app, scenario)
    (first, *_) = response.choices[0].message.tool_calls
    assert response.choices[0].finish_reason == "tool_calls" and response.choices[0].message.content is None
    assert first.id == "call_1_0" and first.type == "function" and first.function.name == "city"
    assert json.loads(first.function.arguments)["city"] in ("Oslo", "Rome")


def test_schema_off_and_parallel_tool_calls_off_decode_as_their_offline_settings(app, offline):
    async def scenario(client, http):
        loose = client.chat.completions.create(
            model="tools", messages=ASK, max_tokens=40, tool_choice="required", extra_body={"schema": False}
        )
        single = client.chat.completions.create(
            model="tools", messages=ASK, max_tokens=200, tool_choice="required", parallel_tool_calls=False
        )
        return await asyncio.gather(loose, single)

    loose, single = call(app, scenario)
    model = offline["tools"]
    assert served(loose) == offline_reply(
        model, ASK, replace(CONFIG, max_new_tokens=40, schema=False), tool_choice="required"
    )
    assert served(single) == offline_reply(model, ASK, replace(CONFIG, max_steps=1), tool_choice="required")
    assert len(served(single)[1]) == 1


async def agent_loop(ask) -> list[dict]:
    """The loop an agent framework runs: ``ask(messages, tool_choice)`` gives the assistant's message; each tool call
    is executed and its result sent back, until an answer without calls.  The first turn requires a tool, later ones
    are "auto" (the OpenAI Agents SDK's default ``reset_tool_choice``)."""
    messages = list(ASK)
    for turn in range(4):
        message = await ask(messages, "required" if turn == 0 else "auto")
        messages.append(message)
        if not message.get("tool_calls"):
            break
        for tool in message["tool_calls"]:
            result = execute(tool["function"]["name"], json.loads(tool["function"]["arguments"]))
            messages.append({"role": "tool", "tool_call_id": tool["id"], "content": result})
    return messages


def test_the_openai_sdk_runs_a_whole_agent_loop_with_the_answers_of_tokmem_chat(app, offline):
    async def scenario(client, http):
        async def ask(messages, tool_choice):
            response = await client.chat.completions.create(
                model="tools", messages=messages, tools=TOOLS, tool_choice=tool_choice, max_tokens=200
            )
            return response.choices[0].message.model_dump(exclude_none=True)  # as docs/serving.md's loop does

        return await agent_loop(ask)

    cache = tokmem.ChatCache()

    async def ask_offline(messages, tool_choice):
        message = tokmem.chat(offline["tools"], messages, ["city", "count"], tool_choice, CONFIG, cache).message
        return {key: value for key, value in message.items() if value is not None}

    conversation = call(app, scenario)
    assert conversation == asyncio.run(agent_loop(ask_offline))
    assert [m["role"] for m in conversation[1:3]] == ["assistant", "tool"]  # called a tool, got its result back
    assert conversation[-1]["role"] == "assistant" and isinstance(conversation[-1]["content"], str)  # then answered


def test_streamed_tool_calls_are_deltas_the_sdk_assembles_into_the_whole_answer(app, offline):
    async def scenario(client, http):
        options = dict(model="tools", messages=ASK, max_tokens=200, tools=TOOLS, tool_choice="required")
        async with client.chat.completions.stream(**options) as stream:
            chunks = [event.chunk async for event in stream if event.type == "chunk"]
            final = await stream.get_final_completion()
        return chunks, final

    chunks, final = call(app, scenario)
    assert served(final) == offline_reply(offline["tools"], ASK, tool_choice="required", tools=["city", "count"])
    deltas = [d for chunk in chunks for choice in chunk.choices for d in choice.delta.tool_calls or []]
    firsts = [d for d in deltas if d.id is not None]
    assert [d.index for d in firsts] == list(range(len(final.choices[0].message.tool_calls)))
    assert all(d.type == "function" and d.function.name for d in firsts)
    assert all(d.function.name is None and d.function.arguments for d in deltas if d.id is None)
    assert len(deltas) > len(firsts)  # the arguments arrive in pieces
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_turn_of_repeated_calls_is_decoded_again_without_them_whole_or_streamed_as_tokmem_chat_does(app, offline):
    async def scenario(client, http):
        options = dict(model="ping", messages=PINGED, max_tokens=16, extra_body={"threshold": 0.0})
        first = await client.chat.completions.create(**{**options, "messages": PINGED[:1]})
        whole = await client.chat.completions.create(**options)
        chunks = [chunk async for chunk in await client.chat.completions.create(**options, stream=True)]
        return first, whole, chunks

    first, whole, chunks = call(app, scenario)
    assert {c.function.name for c in first.choices[0].message.tool_calls} == {"ping"}  # it would call it again
    offline_answer = offline_reply(offline["ping"], PINGED, config=DecodeConfig(threshold=0.0, max_new_tokens=16))
    assert served(whole) == offline_answer and not offline_answer[1]
    deltas = [choice.delta for chunk in chunks for choice in chunk.choices]
    assert not any(delta.tool_calls for delta in deltas)  # the repeat never went out
    streamed = "".join(delta.content or "" for delta in deltas), [], chunks[-1].choices[0].finish_reason
    assert streamed == offline_answer


@pytest.mark.parametrize(
    "request_body, message",
    [
        ({"tools": [{"type": "function", "function": {"name": "weather"}}]}, "tools: 'weather' not a tool in the bank"),
        ({"tools": TOOLS[1:], "tool_choice": {"type": "function", "function": {"name": "city"}}}, "tool_choice:"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        (
            {"tool_choice": "required", "extra_body": {"procedure": "chat"}},
            "procedure (routing skipped) cannot be combined",
        ),
        ({"frequency_penalty": 0.5}, "frequency_penalty is not supported"),
        ({"logprobs": True}, "logprobs is not supported"),
        ({"n": 2}, "this server answers one choice per request"),
        ({"extra_body": {"functions": [{"name": "city"}]}}, "legacy form of tools"),
        ({"extra_body": {"reasoning_effort": "low"}}, "reasoning_effort: not a field this server takes"),
        ({"response_format": {"type": "json_schema"}}, "json_schema is given with type 'json_schema'"),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "city", "parameters": {"properties": {"place": {}}}}}
                ]
            },
            "'place' not a parameter of the bank's tool 'city' (it learned 'city')",
        ),
        ({"messages": [*ASK, {"role": "tool", "content": "sunny"}]}, "needs the tool_call_id"),
        ({"messages": CONVERSATION[1:]}, "messages[0]: the conversation must start"),
        (
            {"messages": CONVERSATION[:2] + [{"role": "user", "content": "and?"}]},
            "no 'tool' message answers tool call(s) a",
        ),
        (
            {
                "messages": [
                    *ASK,
                    {"role": "assistant", "tool_calls": [tool_call("a", "weather", {})]},
                    {"role": "tool", "tool_call_id": "a", "content": "x"},
                ]
            },
            "'weather' is not a tool in the bank",
        ),
        (
            {
                "messages": [
                    *ASK,
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {"id": "a", "type": "function", "function": {"name": "city", "arguments": "not json"}}
                        ],
                    },
                    {"role": "tool", "tool_call_id": "a", "content": "x"},
                ]
            },
            "arguments: must be a JSON object",
        ),
    ],
)
def test_bad_tool_requests_get_400_naming_the_field_in_the_answer_and_the_server_log(
    app, request_body, message, caplog
):
    request = {"model": "tools", "messages": ASK, "max_tokens": 8, **request_body}

    async def scenario(client, http):
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(**request)
        return caught.value

    assert message in call(app, scenario).body["message"]
    assert any("refused with 400" in r.message and message in r.message for r in caplog.records)


def test_the_values_that_leave_unimplemented_fields_off_are_accepted(app, offline):
    async def scenario(client, http):
        return await client.chat.completions.create(
            model="tools",
            messages=ASK,
            max_tokens=200,
            top_p=1,
            stop=[],
            logprobs=False,
            response_format={"type": "text"},
            presence_penalty=0,
        )

    assert served(call(app, scenario)) == offline_reply(offline["tools"], ASK)


def test_schema_bound_rows_keep_their_grammar_as_rows_without_one_join_and_leave(lively_backbone, tmp_path, offline):
    """The engine driven step by step: a tool row joins a running row of a bank without schemas, another tool row
    joins later, the plain row leaves first; each tool answer equals tokmem.chat's."""
    registry, engine = BankRegistry(lively_backbone, tmp_path / "banks"), Engine(lively_backbone)
    tokenizer, tools = lively_backbone.tokenizer, registry.get("tools")
    model = tools.model

    def tool_request(messages, tool_choice):
        allowed, forced, threshold = tool_routing(model, None, tool_choice, CONFIG.threshold)
        return Request(
            tools,
            conversation_ids(model, messages),
            "",
            max_tokens=CONFIG.max_new_tokens,
            allowed=allowed,
            forced=forced,
            threshold=threshold,
            max_steps=1 if isinstance(tool_choice, dict) else CONFIG.max_steps,  # a named tool: one call
            references=False,  # as the API asks for a chat: arguments are values (tokmem.chat)
        )

    plain = engine.submit(Request(registry.get("alpha"), chat_prefix(tokenizer, "hi"), "hi", max_tokens=6))
    engine.step()
    first = engine.submit(tool_request(ASK, "required"))
    for _ in range(3):
        engine.step()
    second = engine.submit(tool_request(CONVERSATION, {"type": "function", "function": {"name": "count"}}))
    while engine.step():
        pass
    assert plain.finish_reason == "length" and len(plain.tokens) == 6
    for handle, messages, choice in (
        (first, ASK, "required"),
        (second, CONVERSATION, {"type": "function", "function": {"name": "count"}}),
    ):
        reply = reply_from(model, handle.tokens, handle.plain, len(messages))
        assert reply == tokmem.chat(model, messages, tool_choice=choice, config=CONFIG)
        assert reply.tool_calls
