"""Schemas from users cannot hurt anyone else (issue 39): each of the three defects a fuzz found, sent while six clean
requests decode on other banks: the bad one gets its own 4xx (a pydantic schema with ``$defs``: its correct answer),
the six get 200 and exactly their offline answers, and a refused upload leaves the bank directory as it was."""

import asyncio

import pytest
from helpers import Measure, bank_files, call, expected, files, random_rows, serve

import tokmem
from tokmem import DecodeConfig

CLEAN = [("alpha", "Reverse apple."), ("beta", "hi"), ("gamma", "What is the weather like today?")] * 2
FORCE = {"type": "function", "function": {"name": "measure"}}
ASK = [{"role": "user", "content": "How long is it?"}]


@pytest.fixture
def app(lively_backbone, tmp_path, offline):
    app, engine = serve(lively_backbone, tmp_path / "banks", max_new_tokens=128, max_prompt_tokens=400)
    engine.start()
    yield app
    engine.stop()


def tool_bank(backbone, path, schema: dict):
    """A bank with a tool row 'measure' under ``schema`` and a text row, saved at ``path``; its model."""
    model = tokmem.create(backbone)
    model.bank.add(["measure", "chat"], backbone.mean_embedding(), kinds=["tool", "text"], schemas=[schema, None])
    random_rows(model.bank, scale=0.7)
    model.bank.save(path)
    return model


def beside_clean(app, request):
    """``request(http)`` sent together with the six clean requests: (its response, their statuses and answers)."""

    async def clean(http):
        bodies = [{"model": bank, "prompt": query, "max_tokens": 10, "threshold": 0.0} for bank, query in CLEAN]
        responses = await asyncio.gather(*[http.post("/v1/completions", json=body) for body in bodies])
        return [(r.status_code, r.json()["choices"][0]["text"] if r.status_code == 200 else r.text) for r in responses]

    async def scenario(client, http):
        return await asyncio.gather(request(http), clean(http))

    return call(app, scenario)


def assert_clean(offline, answers) -> None:
    assert answers == [(200, expected(offline, bank, query, threshold=0.0).text) for bank, query in CLEAN]


def upload(backbone, tmp_path, schema) -> dict:
    model = tool_bank(backbone, tmp_path / "upload" / "bank.safetensors", schema)
    tensors, metadata = bank_files(tmp_path / "upload" / "bank.safetensors")
    return model, {"tensors": tensors, "metadata": metadata}


def test_a_pydantic_schema_with_defs_uploads_and_decodes_its_answer_beside_clean_requests(
    app, offline, lively_backbone, tmp_path
):
    model, sent = upload(lively_backbone, tmp_path, Measure.model_json_schema())
    uploaded, answers = beside_clean(app, lambda http: http.put("/v1/banks/units", files=sent))
    assert uploaded.status_code == 200
    assert_clean(offline, answers)
    body = {"model": "units", "messages": ASK, "tool_choice": FORCE, "max_tokens": 100}
    response, answers = beside_clean(app, lambda http: http.post("/v1/chat/completions", json=body))
    assert response.status_code == 200, response.text
    reply = tokmem.chat(model, ASK, tool_choice=FORCE, config=DecodeConfig(max_new_tokens=100))
    assert response.json()["choices"][0]["message"]["tool_calls"] == [c.to_openai() for c in reply.tool_calls]
    arguments = reply.tool_calls[0].arguments
    if response.json()["choices"][0]["finish_reason"] == "tool_calls":  # the JSON closed: it is a Measure
        Measure.model_validate_json(arguments)
    assert arguments.startswith('{"value":') and ',"unit":{"name":"' in arguments  # the $defs model binds
    assert_clean(offline, answers)


def test_an_upload_with_a_pattern_repeated_20000_times_gets_400_at_once_and_changes_nothing(
    app, offline, lively_backbone, tmp_path
):
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[a-z]{20000}$"}}}
    _, sent = upload(lively_backbone, tmp_path, schema)
    before = files(tmp_path / "banks")
    response, answers = beside_clean(app, lambda http: http.put("/v1/banks/codes", files=sent))
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "schemas[0].properties.code.pattern: the repetition {20000} is over the limit of 128" in message
    assert_clean(offline, answers)
    assert files(tmp_path / "banks") == before


def test_an_upload_with_an_unsupported_keyword_gets_400_naming_it_and_changes_nothing(
    app, offline, lively_backbone, tmp_path
):
    schema = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}
    _, sent = upload(lively_backbone, tmp_path, schema)
    before = files(tmp_path / "banks")
    response, answers = beside_clean(app, lambda http: http.put("/v1/banks/tags", files=sent))
    assert response.status_code == 400
    assert (
        "properties.tags.uniqueItems: the keyword 'uniqueItems' is not supported" in response.json()["error"]["message"]
    )
    assert_clean(offline, answers)
    assert files(tmp_path / "banks") == before


def test_tool_call_arguments_10000_deep_get_400_naming_them_beside_clean_requests(
    app, offline, lively_backbone, tmp_path
):
    tool_bank(lively_backbone, tmp_path / "banks" / "units.safetensors", Measure.model_json_schema())
    deep = '{"value":' + "[" * 10_000 + "]" * 10_000 + "}"
    messages = [
        *ASK,
        {
            "role": "assistant",
            "tool_calls": [{"id": "a", "type": "function", "function": {"name": "measure", "arguments": deep}}],
        },
        {"role": "tool", "tool_call_id": "a", "content": "3 m"},
    ]
    body = {"model": "units", "messages": messages}
    response, answers = beside_clean(app, lambda http: http.post("/v1/chat/completions", json=body))
    assert response.status_code == 400
    assert "messages[1].tool_calls[0].function.arguments: nested too deep" in response.json()["error"]["message"]
    assert_clean(offline, answers)


def test_a_bank_on_disk_whose_schema_cannot_compile_fails_only_its_own_requests(
    app, offline, lively_backbone, tmp_path
):
    schema = {"type": "object", "properties": {"u": {"$ref": "#/$defs/Missing"}}}
    tool_bank(lively_backbone, tmp_path / "banks" / "broken.safetensors", schema)
    body = {"model": "broken", "messages": ASK, "tool_choice": FORCE}
    response, answers = beside_clean(app, lambda http: http.post("/v1/chat/completions", json=body))
    assert response.status_code == 500 and response.json()["error"]["code"] == "bank_unusable"
    assert_clean(offline, answers)


def test_a_schema_slower_to_compile_than_the_servers_budget_is_refused_beside_clean_requests(
    lively_backbone, tmp_path, offline
):
    app, engine = serve(lively_backbone, tmp_path / "banks", schema_seconds=0.001)
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^([a-z]{128}){128}$"}}}
    _, sent = upload(lively_backbone, tmp_path, schema)
    before = files(tmp_path / "banks")
    engine.start()
    try:
        response, answers = beside_clean(app, lambda http: http.put("/v1/banks/slow", files=sent))
    finally:
        engine.stop()
    assert response.status_code == 400
    assert "took longer than the limit of 0.001 s" in response.json()["error"]["message"]
    assert_clean(offline, answers)
    assert files(tmp_path / "banks") == before


def test_a_bank_of_the_servers_own_directory_decodes_however_long_its_schemas_take_to_compile(
    lively_backbone, tmp_path, offline
):
    """The schema budget guards the server against its clients' schemas; a bank the operator put in the directory
    is no client's, so a compile past the budget (3-13 s on a busy CPU) must not lock it out."""
    app, engine = serve(lively_backbone, tmp_path / "banks", schema_seconds=0.001)
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^([a-z]{128}){128}$"}}}
    tool_bank(lively_backbone, tmp_path / "banks" / "slow.safetensors", schema)
    body = {"model": "slow", "messages": ASK, "tool_choice": FORCE, "max_tokens": 8}
    engine.start()
    try:
        response, answers = beside_clean(app, lambda http: http.post("/v1/chat/completions", json=body))
    finally:
        engine.stop()
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "measure"
    assert_clean(offline, answers)
