"""The server decodes banks whose memory tokens are followed by context — a tool's tail (several memory tokens a
tool), the shared rows, its shown schema (tokmem+schema) — as ``tokmem.chat`` does, beside other banks' rows in
flight: tails and shared rows fed after each memory token, a shown schema by a row that joins the batch again
prefilled with it; a composition of such banks keeps each tool's own tail."""

import asyncio
import json
from dataclasses import replace

import pytest
from helpers import (
    call_running,
    city_count_chain,
    city_count_model,
    example_messages,
    ping_bank,
    random_rows,
    serve,
    write_bank,
)

import tokmem
from tokmem import DecodeConfig
from tokmem.model import compose

CONFIG = DecodeConfig(max_new_tokens=40, references=False)
QUERY = example_messages(city_count_chain())[:1]
HISTORY = [
    *QUERY,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "a", "type": "function", "function": {"name": "city", "arguments": '{"city": "Rome"}'}}],
    },
    {"role": "tool", "tool_call_id": "a", "content": "sunny"},
]
SERVED_CASES = [
    {},
    {"tool_choice": "required"},
    {"tool_choice": "none"},
    {"tool_choice": {"type": "function", "function": {"name": "count"}}},
]
FORMS = {
    "shown": {"shows_schemas": True},
    "tails": {"memory_tokens": 2},
    "shared": {"memory_tokens": 2, "shared_tokens": 1},
}


def replies(responses) -> list[tuple]:
    """(content, [(tool, arguments)]) of each response."""
    return [
        (
            r.choices[0].message.content,
            [(c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls or []],
        )
        for r in responses
    ]


def expected_replies(model, cases, config=CONFIG) -> list[tuple]:
    """``replies`` as ``tokmem.chat`` answers each (messages, options) of ``cases``."""
    answers = [tokmem.chat(model, messages, config=config, **options) for messages, options in cases]
    return [(a.content, [(c.name, c.arguments) for c in a.tool_calls]) for a in answers]


@pytest.mark.parametrize("form", FORMS)
def test_the_server_answers_a_bank_with_context_after_its_memory_tokens_as_tokmem_chat_does_with_other_banks_in_flight(
    lively_backbone, tmp_path, form
):
    model = city_count_model(lively_backbone, **FORMS[form])
    model.bank.save(tmp_path / f"{form}.safetensors")
    plain = write_bank(lively_backbone, tmp_path / "alpha.safetensors", rows=3)
    app, engine = serve(lively_backbone, tmp_path, max_new_tokens=64, bank_tools=True)  # as tokmem.chat's tools=None
    cases = [(messages, options) for messages in (QUERY, HISTORY) for options in SERVED_CASES]

    async def scenario(client, http):
        asks = [
            client.chat.completions.create(model=form, messages=messages, max_tokens=40, **options)
            for messages, options in cases
        ]
        others = [
            client.chat.completions.create(model="alpha", messages=QUERY, max_tokens=10, extra_body={"threshold": 0.0})
            for _ in range(2)
        ]
        return await asyncio.gather(*asks, *others, streamed(client))

    async def streamed(client):  # one call (the stream helper refuses an answer cut by max_tokens)
        options = dict(model=form, messages=QUERY, max_tokens=40, tool_choice="required", parallel_tool_calls=False)
        async with client.chat.completions.stream(**options) as stream:
            return await stream.get_final_completion()

    responses = call_running(app, engine, scenario)
    expected = expected_replies(model, cases)
    assert replies(responses[: len(cases)]) == expected
    assert any(calls for _, calls in expected) and any(content for content, _ in expected)
    reference = tokmem.generate(plain, [QUERY[0]["content"]], DecodeConfig(max_new_tokens=10, threshold=0.0))[0]
    assert [r.choices[0].message.content for r in responses[len(cases) : -1]] == [reference.text] * 2
    one_call = replace(CONFIG, max_steps=1)
    assert replies(responses[-1:]) == expected_replies(model, [(QUERY, {"tool_choice": "required"})], one_call)


def test_a_composition_of_banks_with_tails_reads_each_tools_own_tail(lively_backbone, tmp_path):
    ping = ping_bank(lively_backbone, memory_tokens=2)
    random_rows(ping.bank, seed=1, scale=0.7)
    ping.bank.save(tmp_path / "ping.safetensors")
    weather = city_count_model(lively_backbone, memory_tokens=2)
    weather.bank.save(tmp_path / "weather.safetensors")
    composed = compose([ping, weather], ["ping", "weather"])  # weather's rows and tails both move past ping's
    app, engine = serve(lively_backbone, tmp_path, max_new_tokens=64)
    cases = [
        (messages, {"tool_choice": {"type": "function", "function": {"name": name}}})
        for messages in (QUERY, HISTORY)
        for name in ("city", "count")
    ]

    async def scenario(client, http):
        asks = [
            client.chat.completions.create(model="ping+weather", messages=messages, max_tokens=40, **options)
            for messages, options in cases
        ]
        return await asyncio.gather(*asks)

    responses = call_running(app, engine, scenario)
    expected = expected_replies(composed, cases)
    assert replies(responses) == expected
    assert [calls[0][0] for _, calls in expected] == ["city", "count"] * 2
    assert all(json.loads(calls[0][1]) is not None for _, calls in expected)
