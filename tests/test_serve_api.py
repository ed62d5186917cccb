"""The HTTP API through the official `openai` SDK, in-process (httpx's ASGI transport), on tiny-random banks."""

import asyncio
import json

import openai
import pytest
from helpers import (
    COMPLETION_SCOPE,
    QUERIES,
    SERVED_BANKS,
    bank_files,
    call,
    expected,
    files,
    serve,
    write_bank,
)

import tokmem
from tokmem import DecodeConfig
from tokmem.cli import main
from tokmem.extras import EXTRAS
from tokmem.training.sequences import chat_prefix
from tokmem.serve.stream import Deltas


@pytest.fixture
def app(lively_backbone, tmp_path, offline):
    app, engine = serve(  # bank_tools: every row may route, as generate's
        lively_backbone,
        tmp_path / "banks",
        max_prompt_tokens=200,
        max_new_tokens=64,
        max_body_mb=1 / 16,
        bank_tools=True,
    )
    engine.start()
    yield app
    engine.stop()


def trace(generation) -> list[dict]:
    return [{"procedure": s.procedure, "text": s.text} for s in generation.trace]


# ---- answers --------------------------------------------------------------------------------------------
def test_chat_answers_equal_generate_with_other_banks_requests_in_flight(app, offline):
    jobs = [(bank, query) for bank in SERVED_BANKS for query in QUERIES[:2]]

    async def scenario(client, http):
        return await asyncio.gather(
            *[
                client.chat.completions.create(
                    model=bank,
                    messages=[{"role": "user", "content": query}],
                    max_tokens=10,
                    extra_body={"threshold": 0.0},
                )
                for bank, query in jobs
            ]
        )

    tokenizer = offline["alpha"].backbone.tokenizer
    for (bank, query), response in zip(jobs, call(app, scenario)):
        reference = expected(offline, bank, query, threshold=0.0)
        assert response.choices[0].message.content == reference.text
        assert response.model == bank and response.object == "chat.completion"
        assert response.tokmem["trace"] == trace(reference) and response.tokmem["procedures"] == reference.procedures
        assert response.tokmem["routed"] == (bank != "empty")
        assert response.usage.prompt_tokens == len(chat_prefix(tokenizer, query))
        if response.choices[0].finish_reason == "length":
            assert response.usage.completion_tokens == 10
        assert response.usage.total_tokens == response.usage.prompt_tokens + response.usage.completion_tokens


def test_text_completions_treat_the_prompt_as_the_query_and_take_the_extras(app, offline):
    async def scenario(client, http):
        return await client.completions.create(
            model="beta", prompt=QUERIES[2], max_tokens=12, extra_body={"procedure": "p3", "max_steps": 2}
        )

    response = call(app, scenario)
    reference = tokmem.generate(
        offline["beta"], [QUERIES[2]], DecodeConfig(max_new_tokens=12, max_steps=2), procedure="p3"
    )[0]
    assert response.choices[0].text == reference.text and response.object == "text_completion"
    assert response.tokmem["procedures"][0] == "p3" and response.tokmem["trace"] == trace(reference)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_streamed_chunks_add_up_to_the_answer_then_usage_then_done(app, offline, endpoint):
    options = dict(
        model="alpha", max_tokens=16, extra_body={"threshold": 0.0}, stream=True, stream_options={"include_usage": True}
    )

    async def scenario(client, http):
        if endpoint == "chat":
            stream = await client.chat.completions.create(messages=[{"role": "user", "content": QUERIES[0]}], **options)
        else:
            stream = await client.completions.create(prompt=QUERIES[0], **options)
        chunks = [chunk async for chunk in stream]
        body = {"model": "alpha", "max_tokens": 4, "stream": True, "prompt": "hi"}
        raw = await http.post("/v1/completions", json=body)
        return chunks, raw

    chunks, raw = call(app, scenario)
    reference = expected(offline, "alpha", QUERIES[0], max_tokens=16, threshold=0.0)
    choices = [chunk.choices[0] for chunk in chunks if chunk.choices]
    pieces = [(c.delta.content if endpoint == "chat" else c.text) or "" for c in choices]
    assert "".join(pieces) == reference.text and len([p for p in pieces if p]) > 1
    assert [c.finish_reason for c in choices[:-1]] == [None] * (len(choices) - 1) and choices[
        -1
    ].finish_reason == "length"
    final = [chunk for chunk in chunks if chunk.choices][-1]
    assert final.tokmem["trace"] == trace(reference)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert raw.text.rstrip().endswith("data: [DONE]") and "usage" not in raw.text


def test_streamed_text_waits_for_whole_characters_and_for_text_that_settles():
    deltas = Deltas()
    decodings = ["a", "ab\ufffd", "ab\ufffd", "ab鱙", "ab鱙}", "ab鱙c}"]  # "}": text assembled after a segment
    sent = [deltas.update(text) for text in decodings] + [deltas.final("ab鱙cd}")]
    assert sent == ["", "a", "b", "", "鱙", "", "cd}"]


def test_models_list_every_bank_with_the_backbone_as_parent_and_health_answers(app):
    async def scenario(client, http):
        return await client.models.list(), (await http.get("/health")).json()

    models, health = call(app, scenario)
    assert sorted(m.id for m in models.data) == sorted(SERVED_BANKS)
    assert {m.parent for m in models.data} == {"tiny-random-x20"} and {m.owned_by for m in models.data} == {"tokmem"}
    assert health["status"] == "ok" and health["backbone"] == "tiny-random-x20"


# ---- bad requests ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "body, status, message",
    [
        ({"model": "delta"}, 404, "no bank named 'delta'"),
        ({"temperature": -1}, 400, "temperature"),
        ({"n": 2}, 400, "n:"),
        ({"extra_body": {"procedure": "nope"}}, 400, "no procedure 'nope'"),
        ({"max_tokens": 65}, 400, "at most 64"),
        ({"messages": [{"role": "user", "content": "x" * 300}]}, 400, "at most 200"),
        ({"messages": [{"role": "assistant", "content": "hi"}]}, 400, "the last message must be the user's"),
        ({"messages": []}, 400, "messages"),
    ],
)
def test_bad_requests_get_an_openai_error_body_and_status(app, body, status, message):
    request = {"model": "alpha", "messages": [{"role": "user", "content": "hi"}], **body}

    async def scenario(client, http):
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(**request)
        return caught.value

    error = call(app, scenario)
    assert error.status_code == status
    assert message in error.body["message"] and error.body["type"]


def test_an_oversized_body_gets_413(app):
    async def scenario(client, http):
        return await http.post("/v1/completions", json={"model": "alpha", "prompt": "x" * 2**17})

    response = call(app, scenario)
    assert response.status_code == 413 and "limit of 65536 bytes" in response.json()["error"]["message"]


def test_a_full_queue_answers_429(lively_backbone, tmp_path, offline):
    app, _ = serve(lively_backbone, tmp_path / "banks", {"max_queue": 0})

    async def scenario(client, http):
        with pytest.raises(openai.RateLimitError) as caught:
            await client.completions.create(model="alpha", prompt="hi")
        return caught.value

    assert "busy" in call(app, scenario).body["message"]


def test_a_request_over_the_time_limit_gets_504(lively_backbone, tmp_path, offline):
    app, engine = serve(lively_backbone, tmp_path / "banks", timeout=0.0)
    engine.start()
    try:
        response = call(app, lambda client, http: http.post("/v1/completions", json={"model": "alpha", "prompt": "hi"}))
    finally:
        engine.stop()
    assert response.status_code == 504 and "limit of 0 s" in response.json()["error"]["message"]


def test_a_client_that_disconnects_frees_its_row(lively_backbone, tmp_path, offline):
    """Raw ASGI: the body arrives, then the client is gone; the answer stops long before max_tokens."""
    app, engine = serve(lively_backbone, tmp_path / "banks", max_new_tokens=100_000)
    body = json.dumps({"model": "alpha", "prompt": "hi", "max_tokens": 100_000, "ignore_eos": True}).encode()
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent = []

    async def receive():
        if messages:
            return messages.pop()
        await asyncio.sleep(0.2)  # a few decoding steps, then the client is gone
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = COMPLETION_SCOPE
    engine.start()
    try:
        asyncio.run(asyncio.wait_for(app(scope, receive, send), timeout=60))
    finally:
        engine.stop()
    answer = json.loads(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))
    assert answer["choices"][0]["finish_reason"] == "cancelled"
    assert 0 < answer["usage"]["completion_tokens"] < 100_000 and engine.batch is None


# ---- bank management ------------------------------------------------------------------------------------
def test_an_uploaded_bank_replaces_the_old_one_for_new_requests_and_delete_removes_it(
    app, lively_backbone, tmp_path, offline
):
    new = write_bank(lively_backbone, tmp_path / "new" / "bank.safetensors", rows=2, seed=7)
    tensors, metadata = bank_files(tmp_path / "new" / "bank.safetensors")

    async def scenario(client, http):
        ask = dict(model="alpha", prompt=QUERIES[0], max_tokens=10, extra_body={"threshold": 0.0})
        before = await client.completions.create(**ask)
        put = await http.put("/v1/banks/alpha", files={"tensors": tensors, "metadata": metadata})
        after = await client.completions.create(**ask)
        deleted = await http.delete("/v1/banks/alpha")
        with pytest.raises(openai.NotFoundError):
            await client.completions.create(**ask)
        return before, put.json(), after, deleted.status_code, await client.models.list()

    before, put, after, deleted, models = call(app, scenario)
    assert before.choices[0].text == expected(offline, "alpha", QUERIES[0], threshold=0.0).text
    assert (
        put["procedures"] == ["p0", "p1"]
        and after.tokmem["bank_revision"] == put["revision"] != before.tokmem["bank_revision"]
    )
    assert (
        after.choices[0].text
        == tokmem.generate(new, [QUERIES[0]], DecodeConfig(max_new_tokens=10, threshold=0.0))[0].text
    )
    assert deleted == 200 and "alpha" not in [m.id for m in models.data]
    assert not (tmp_path / "banks" / "alpha.safetensors").exists()


def corrupt(kind, lively_backbone, backbone, tmp_path) -> tuple[str, bytes, bytes]:
    """(name, safetensors, json) of one kind of bad upload."""
    path = tmp_path / "bad" / "bank.safetensors"
    model = write_bank(backbone if kind == "wrong-backbone" else lively_backbone, path, rows=2)
    tensors, metadata = bank_files(path)
    if kind == "truncated":
        tensors = tensors[: len(tensors) // 2]
    elif kind == "not-json":
        metadata = b"{not json"
    elif kind == "shape":
        meta = json.loads(metadata)
        meta["names"].append("extra")
        meta["kinds"].append("text")
        meta["descriptions"].append("")
        meta["schemas"].append(None)
        metadata = json.dumps(meta).encode()
    elif kind == "nan":
        model.bank.index[1, 3] = float("nan")
        from safetensors.torch import save

        tensors = save({"index": model.bank.index})
    return (
        ("..%2Falpha" if kind == "traversal" else "fresh"),
        tensors,
        metadata,
    )  # %2F: a client cannot normalise it away


@pytest.mark.parametrize(
    "kind, status, message",
    [
        ("traversal", 400, "invalid bank name"),
        ("truncated", 400, "corrupted or truncated"),
        ("not-json", 400, "corrupted metadata"),
        ("shape", 400, "has shape (2, 64), the metadata says (3, 64)"),
        ("nan", 400, "NaN/Inf"),
        ("wrong-backbone", 400, "was trained for backbone 'tiny-random'"),
    ],
)
def test_bad_uploads_are_refused_and_leave_the_bank_directory_as_it_was(
    app, lively_backbone, backbone, tmp_path, kind, status, message
):
    name, tensors, metadata = corrupt(kind, lively_backbone, backbone, tmp_path)
    before = files(tmp_path / "banks")

    async def scenario(client, http):
        return await http.put(f"/v1/banks/{name}", files={"tensors": tensors, "metadata": metadata})

    response = call(app, scenario)
    assert response.status_code == status and message in response.json()["error"]["message"]
    assert str(tmp_path) not in response.json()["error"]["message"]  # names the upload, not the server's folders
    assert files(tmp_path / "banks") == before


def test_an_oversized_upload_gets_413_and_changes_nothing(app, lively_backbone, tmp_path):
    write_bank(lively_backbone, tmp_path / "big" / "bank.safetensors", rows=300)
    tensors, metadata = bank_files(tmp_path / "big" / "bank.safetensors")
    before = files(tmp_path / "banks")
    response = call(
        app, lambda client, http: http.put("/v1/banks/big", files={"tensors": tensors, "metadata": metadata})
    )
    assert response.status_code == 413 and files(tmp_path / "banks") == before


def test_bank_management_needs_the_api_key_when_one_is_set(lively_backbone, tmp_path, offline):
    app, engine = serve(lively_backbone, tmp_path / "banks", api_key="secret")

    async def scenario(client, http):
        refused = await http.delete("/v1/banks/gamma")
        wrong = await http.delete("/v1/banks/gamma", headers={"Authorization": "Bearer guess"})
        allowed = await http.delete("/v1/banks/gamma", headers={"Authorization": "Bearer secret"})
        return refused, wrong, allowed

    refused, wrong, allowed = call(app, scenario)
    assert refused.status_code == wrong.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
    assert allowed.status_code == 200 and not (tmp_path / "banks" / "gamma.safetensors").exists()


def test_serve_without_the_server_extra_fails_at_once_naming_it(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(EXTRAS, "serve", ("fastapi", "tokmem_no_such_module"))
    assert main(["serve", "--banks", str(tmp_path), "--backbone", "tiny-random"]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "pip install 'tokmem[serve]'" in error


def test_serve_flags_are_the_config_fields_with_their_types_defaults_and_choices(capsys):
    from dataclasses import fields

    from tokmem.cli import build_parser
    from tokmem.serve.config import ServeConfig

    args = build_parser().parse_args(
        ["serve", "--banks", "d", "--protect", "all", "--max-connections", "3", "--header-timeout", "0.5"]
    )
    given = ServeConfig(**{f.name: getattr(args, f.name) for f in fields(ServeConfig)})
    assert given == ServeConfig(banks="d", protect="all", max_connections=3, header_timeout=0.5)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--banks", "d", "--protect", "some"])
    assert "invalid choice: 'some'" in capsys.readouterr().err
