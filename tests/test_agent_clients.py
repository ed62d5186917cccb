"""The clients agent developers already use, unmodified, against a real `tokmem serve` on loopback (tiny-random
banks: the model's quality does not matter here, the protocol does): the OpenAI Agents SDK and LangChain call the
travel tools, get their results back and end with an answer, streamed too; `tool_choice` required and named;
structured output through `response_format` parses (the grammar makes the JSON valid even on random weights);
a client's strict schema is obeyed; and the three example clients in examples/travel/ run to their end."""

import asyncio
import json
import re

import openai
import pytest
from agents import Agent, ModelSettings, Runner, set_tracing_disabled
from helpers import loopback, random_rows, serve, travel_script
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

import tokmem

QUESTION = "What is the weather in Lisbon in celsius?"


TOOLS = travel_script("travel_tools").TOOLS
TOOL_NAMES = [tool["function"]["name"] for tool in TOOLS]
FINAL = {"threshold": 1.0}  # after the tool turn: the plain backbone's answer (tiny-random rows would route anywhere)
WORD = "^[A-Za-z0-9 -]{1,12}$"


def bounded(tool: dict) -> dict:
    """``tool`` with its free strings and numbers bounded (a pattern, a range), as a client may narrow the bank's
    schema: on random weights a free string or number seldom closes within a test's token budget."""
    tool = json.loads(json.dumps(tool))
    for spec in tool["function"]["parameters"]["properties"].values():
        if spec["type"] == "string" and "enum" not in spec:
            spec["pattern"] = WORD
        elif spec["type"] == "number":
            spec.update(type="integer", minimum=1, maximum=9999)
    return tool


BOUNDED = [bounded(tool) for tool in TOOLS]


class Weather(BaseModel):
    city: str = Field(pattern=WORD)
    celsius: int = Field(ge=-40, le=50)
    sunny: bool


class Trip(BaseModel):
    weather: Weather  # nested: pydantic writes it as a $ref into $defs
    nights: int = Field(ge=1, le=30)


@pytest.fixture(scope="module")
def base_url(lively_backbone, tmp_path_factory):
    """``tokmem serve`` on loopback over a ``travel`` bank (the three tools with their schemas) and a ``billing``
    bank (one tool), both of the lively tiny-random backbone."""
    banks = tmp_path_factory.mktemp("banks")
    for name, tools, seed in (("travel", TOOLS, 0), ("billing", [{"function": {"name": "refund"}}], 1)):
        model = tokmem.create(lively_backbone)
        names = [tool["function"]["name"] for tool in tools]
        schemas = [tool["function"].get("parameters") for tool in tools]
        model.bank.add(names, lively_backbone.mean_embedding(), kinds=["tool"] * len(tools), schemas=schemas)
        random_rows(model.bank, seed=seed, scale=0.7)
        model.bank.save(banks / f"{name}.safetensors")
    app, engine = serve(lively_backbone, banks, max_new_tokens=400, max_prompt_tokens=1500)
    set_tracing_disabled(True)
    with loopback(app) as (host, port):
        yield f"http://{host}:{port}/v1"


def travel_agent(base_url, **options) -> Agent:
    return travel_script("agents_sdk").agent(base_url, "travel", tools=BOUNDED, **options)


def tool_calls(result) -> list[tuple[str, dict]]:
    return [
        (item.raw_item.name, json.loads(item.raw_item.arguments))
        for item in result.new_items
        if item.type == "tool_call_item"
    ]


def assert_travel_call(name: str, arguments: dict) -> None:
    """A call of one of the travel tools with exactly its parameters (the strict schema's)."""
    (tool,) = [t["function"] for t in BOUNDED if t["function"]["name"] == name]
    assert list(arguments) == list(tool["parameters"]["properties"])
    for key, spec in tool["parameters"]["properties"].items():
        assert arguments[key] in spec["enum"] if "enum" in spec else re.fullmatch(WORD, str(arguments[key]))


# ---- the OpenAI Agents SDK --------------------------------------------------------------------------------
def test_the_agents_sdk_calls_a_tool_gets_its_result_and_ends_with_an_answer(base_url):
    settings = ModelSettings(tool_choice="required", top_p=0.9, extra_body=FINAL, max_tokens=400)
    result = Runner.run_sync(travel_agent(base_url, model_settings=settings), QUESTION, max_turns=4)
    calls = tool_calls(result)
    assert calls and all(name in TOOL_NAMES for name, _ in calls)
    for name, arguments in calls:
        assert_travel_call(name, arguments)
    outputs = [item.output for item in result.new_items if item.type == "tool_call_output_item"]
    assert len(outputs) == len(calls) and all(json.loads(output) for output in outputs)
    assert isinstance(result.final_output, str)


def test_the_agents_sdk_streams_a_named_tool_call_then_the_answer(base_url):
    settings = ModelSettings(tool_choice="search_flights", extra_body=FINAL, max_tokens=400)

    async def run():
        result = Runner.run_streamed(travel_agent(base_url, model_settings=settings), QUESTION, max_turns=4)
        events = [event.type async for event in result.stream_events()]
        return result, events

    result, events = asyncio.run(run())
    assert "raw_response_event" in events
    assert [name for name, _ in tool_calls(result)][:1] == ["search_flights"]
    assert_travel_call(*tool_calls(result)[0])
    assert isinstance(result.final_output, str)


def test_the_agents_sdk_output_type_is_parsed_from_the_schema_bound_answer(base_url):
    settings = ModelSettings(tool_choice="required", extra_body=FINAL, max_tokens=300)
    agent = travel_agent(base_url, model_settings=settings, output_type=Weather)
    result = Runner.run_sync(agent, QUESTION, max_turns=4)
    assert tool_calls(result) and isinstance(result.final_output, Weather)


# ---- LangChain -----------------------------------------------------------------------------------------
def chat_model(base_url, model="travel", **options) -> ChatOpenAI:
    return ChatOpenAI(model=model, base_url=base_url, api_key="unused", max_retries=0, **options)


def test_langchain_calls_a_named_tool_takes_its_result_and_answers(base_url):
    llm = chat_model(base_url, max_tokens=400)
    ai = llm.bind_tools(BOUNDED, tool_choice="get_weather", strict=True).invoke([HumanMessage(QUESTION)])
    (call,) = ai.tool_calls[:1]
    assert call["name"] == "get_weather"
    assert_travel_call(call["name"], call["args"])
    result = travel_script("travel_tools").run_tool(call["name"], call["args"])
    messages = [HumanMessage(QUESTION), ai, *[ToolMessage(result, tool_call_id=c["id"]) for c in ai.tool_calls]]
    final = chat_model(base_url, max_tokens=60, extra_body=FINAL).bind_tools(BOUNDED).invoke(messages)
    assert not final.tool_calls and isinstance(final.text, str)


def test_langchain_streams_required_tool_calls_that_assemble_into_whole_calls(base_url):
    model = chat_model(base_url, max_tokens=200).bind_tools(BOUNDED, tool_choice="required")
    chunks = list(model.stream([HumanMessage(QUESTION)]))
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole += chunk
    assert len(chunks) > 2 and whole.tool_calls
    for call in whole.tool_calls:
        assert_travel_call(call["name"], call["args"])


def test_langchain_structured_output_as_json_schema_and_json_mode_parses(base_url):
    llm = chat_model(base_url, max_tokens=300)
    weather = llm.with_structured_output(Weather, method="json_schema").invoke(QUESTION)
    # json_mode is any JSON object: on random weights its strings close by chance only, and this question's greedy
    # answer closes within the budget (the grammar makes whatever closes valid JSON)
    loose = llm.with_structured_output(Weather.model_json_schema(), method="json_mode").invoke(
        "Weather in Rome, then count."
    )
    assert isinstance(weather, Weather) and isinstance(loose, dict) and loose
    trip = llm.with_structured_output(Trip, method="json_schema").invoke(QUESTION)
    assert "$defs" in Trip.model_json_schema() and isinstance(trip.weather, Weather)


def test_a_clients_strict_schema_is_obeyed_and_one_over_unlearned_names_refused(base_url):
    fahrenheit = json.loads(json.dumps(BOUNDED[0]))
    fahrenheit["function"]["parameters"]["properties"]["unit"]["enum"] = ["fahrenheit"]
    llm = chat_model(base_url, max_tokens=400)
    ai = llm.bind_tools([fahrenheit], tool_choice="get_weather", strict=True).invoke([HumanMessage(QUESTION)])
    assert [call["args"]["unit"] for call in ai.tool_calls] == ["fahrenheit"] * len(ai.tool_calls) and ai.tool_calls
    location = json.loads(json.dumps(BOUNDED[0]))
    properties = location["function"]["parameters"]["properties"]
    properties["location"] = properties.pop("city")
    with pytest.raises(openai.BadRequestError, match="'location' not a parameter of the bank's tool 'get_weather'"):
        llm.bind_tools([location], tool_choice="get_weather").invoke([HumanMessage(QUESTION)])


def test_a_tool_turn_on_composed_banks_equals_the_bank_alone_through_a_client(base_url):
    asked = [HumanMessage(QUESTION)]
    composed, alone = (
        chat_model(base_url, model, max_tokens=400).bind_tools(BOUNDED, tool_choice="required").invoke(asked)
        for model in ("travel+billing", "travel")
    )
    assert composed.tool_calls and [(c["name"], c["args"]) for c in composed.tool_calls] == [
        (c["name"], c["args"]) for c in alone.tool_calls
    ]


# ---- the example clients ---------------------------------------------------------------------------------
@pytest.mark.parametrize("script", ["openai_loop", "agents_sdk", "langchain_agent"])
def test_each_example_client_runs_to_its_end_against_the_server(base_url, script, capsys):
    travel_script(script).main(["--base-url", base_url, "--model", "travel", "--question", QUESTION])
    assert capsys.readouterr().out.strip()


# ---- a bank trained with tokmem train's defaults: OpenAI's contract whatever it routes -----------------------------
@pytest.fixture(scope="module")
def defaults_url(lively_backbone, tmp_path_factory):
    """``tokmem serve`` over the travel bank as ``tokmem train`` makes it with no tuning flag (``picked_config``) on
    the lively tiny-random backbone: its rows route off-topic questions too, so what keeps the contract is the
    server."""
    from helpers import TRAVEL

    from tokmem.data import load_catalog, load_examples
    from tokmem.data.procedures import load_schemas
    from tokmem.training.train import picked_config

    banks, examples = tmp_path_factory.mktemp("trained"), load_examples(TRAVEL / "train.jsonl")
    model = tokmem.create(lively_backbone)
    catalog = TRAVEL / "catalog.json"
    config = picked_config(examples, new_rows=3, progress=False)
    tokmem.learn(model, examples, config, load_catalog(catalog), schemas=load_schemas(catalog))
    model.bank.save(banks / "travel.safetensors")
    app, engine = serve(lively_backbone, banks, max_new_tokens=300, max_prompt_tokens=1500)
    with loopback(app) as (host, port):
        yield f"http://{host}:{port}/v1"


def test_a_plain_chat_question_to_a_trained_bank_is_answered_in_words(defaults_url):
    client = openai.OpenAI(base_url=defaults_url, api_key="unused", max_retries=0)
    routes = {"threshold": 0.0}  # every turn that may route does: only the contract keeps tools out
    answer = client.chat.completions.create(
        model="travel",
        messages=[{"role": "user", "content": "Tell me a joke about cats."}],
        max_tokens=8,
        extra_body=routes,
    )
    assert answer.choices[0].message.tool_calls is None and isinstance(answer.choices[0].message.content, str)
    assert answer.choices[0].finish_reason in ("stop", "length")


def test_langchain_structured_output_parses_on_a_trained_bank(defaults_url):
    llm = chat_model(defaults_url, max_tokens=300, extra_body={"threshold": 0.0})
    assert isinstance(llm.with_structured_output(Weather, method="json_schema").invoke(QUESTION), Weather)
    raw = llm.with_structured_output(Weather, method="json_schema", include_raw=True).invoke(QUESTION)
    assert raw["parsing_error"] is None and isinstance(raw["parsed"], Weather)


def test_the_agents_sdk_loop_on_a_trained_bank_calls_a_listed_tool_and_ends(defaults_url):
    settings = ModelSettings(tool_choice="get_weather", extra_body=FINAL, max_tokens=300)
    result = Runner.run_sync(travel_agent(defaults_url, model_settings=settings), QUESTION, max_turns=4)
    assert tool_calls(result) and all(name in TOOL_NAMES for name, _ in tool_calls(result))
    assert isinstance(result.final_output, str)
