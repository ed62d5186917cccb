"""Hostile and careless clients (issue 20): each bad request gets its status and an OpenAI error body, the
clean requests sent with it get exactly their offline answers, and the bank directory does not change."""

import asyncio
import json
import shutil
import socket

import openai
import pytest
from helpers import COMPLETION_SCOPE, bank_files, call, expected, files, loopback, serve, write_bank

from tokmem.serve.config import ServeConfig, exposure_warning

CLEAN = [("alpha", "Reverse apple."), ("beta", "hi"), ("gamma", "What is the weather like today?")]


@pytest.fixture
def app(lively_backbone, tmp_path, offline):
    app, engine = serve(
        lively_backbone,
        tmp_path / "banks",
        max_prompt_chars=2000,
        max_prompt_tokens=200,
        max_new_tokens=64,
        max_body_mb=1 / 16,
    )
    engine.start()
    yield app
    engine.stop()


async def clean_answers(http) -> list[str]:
    bodies = [{"model": bank, "prompt": query, "max_tokens": 10, "threshold": 0.0} for bank, query in CLEAN]
    responses = await asyncio.gather(*[http.post("/v1/completions", json=body) for body in bodies])
    return [r.json()["choices"][0]["text"] for r in responses]


def assert_clean(offline, answers) -> None:
    assert answers == [expected(offline, bank, query, threshold=0.0).text for bank, query in CLEAN]


def with_clean_requests(app, request):
    """Send ``request(http)`` together with the clean requests; (its response, the clean answers)."""

    async def scenario(client, http):
        return await asyncio.gather(request(http), clean_answers(http))

    return call(app, scenario)


# ---- request bodies -------------------------------------------------------------------------------------
def chat(content="hi", **fields) -> bytes:
    return json.dumps({"model": "alpha", "messages": [{"role": "user", "content": content}], **fields}).encode()


@pytest.mark.parametrize(
    "body, message",
    [
        (chat(temperature=1e-45), "temperature: Value error, use 0 (greedy) or at least 0.01"),
        (chat(temperature=3), "temperature"),
        (chat(max_steps=9223372036854775808), "max_steps"),
        (chat(max_tokens=9223372036854775808), "max_tokens"),
        (chat(max_completion_tokens=-1), "max_completion_tokens"),
        (b'{"model": "alpha", "prompt": "hi", "threshold": NaN}', "threshold"),
        (b'{"model": "alpha", "prompt": "hi", "temperature": Infinity}', "temperature"),
        (chat("\ud800"), "not valid Unicode"),
        (chat([{"type": "text", "text": "a\udfff"}]), "messages.0.content"),
        (chat(procedure="\ud800"), "not valid Unicode"),
        (json.dumps({"model": "\ud800", "prompt": "hi"}).encode(), "unicode"),
        (chat("x" * 2001), "the prompt has 2001 characters; this server allows at most 2000"),
        (
            json.dumps({"model": "alpha", "messages": [{"role": "user", "content": "x" * 1500}] * 2}).encode(),
            "3000 characters",
        ),
        (b'{"model": "alpha", "prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}", ""),
        (b"\xff\xfe", ""),
    ],
    ids=[
        "tiny-temperature",
        "hot-temperature",
        "max-steps-overflow",
        "max-tokens-overflow",
        "negative-tokens",
        "nan",
        "infinity",
        "lone-surrogate",
        "surrogate-part",
        "surrogate-procedure",
        "surrogate-model",
        "long-prompt",
        "long-conversation",
        "deep-json",
        "not-utf8",
    ],
)
def test_a_bad_body_gets_400_and_the_requests_beside_it_answer_exactly(app, offline, tmp_path, body, message):
    before = files(tmp_path / "banks")
    path = "/v1/completions" if b'"prompt"' in body else "/v1/chat/completions"
    response, answers = with_clean_requests(
        app, lambda http: http.post(path, content=body, headers={"content-type": "application/json"})
    )
    assert response.status_code in (400, 422) and message in response.json()["error"]["message"]
    assert_clean(offline, answers)
    assert files(tmp_path / "banks") == before


# ---- uploads --------------------------------------------------------------------------------------------
def upload(lively_backbone, tmp_path, edit=None, rows=None) -> dict:
    """The files of an upload: a valid bank, its metadata edited by ``edit(meta)`` or its rows set to ``rows``."""
    path = tmp_path / "upload" / "bank.safetensors"
    model = write_bank(lively_backbone, path, rows=2)
    if rows is not None:
        model.bank.index[:] = rows
        model.bank.save(path)
    tensors, metadata = bank_files(path)
    if edit is not None:
        meta = json.loads(metadata)
        edit(meta)
        metadata = meta if isinstance(meta, bytes) else json.dumps(meta).encode()
    return {"tensors": tensors, "metadata": metadata}


def setter(**fields):
    return lambda meta: meta.update(fields)


@pytest.mark.parametrize(
    "edit, message",
    [
        (setter(backbone="x"), "field 'backbone' must be an object"),
        (setter(hidden_size=-1), "field 'hidden_size' must be a whole number from 1"),
        (setter(names=[[1], [2]]), "field 'names', row 0: invalid procedure name"),
        (setter(names=[1, 2]), "field 'names', row 0: invalid procedure name"),
        (setter(names=["", " x "]), "field 'names', row 0: invalid procedure name"),
        (setter(descriptions=5), "field 'descriptions' must list one text for each of the 2 names"),
        (setter(descriptions=["only one"]), "field 'descriptions' must list one text for each of the 2 names"),
        (setter(backbone={}), "field 'backbone' must give the backbone's 'fingerprint'"),
        (setter(backbone=None), "field 'backbone' must give the backbone's 'fingerprint'"),
        (setter(x=json.loads("[" * 900 + "]" * 900)), None),  # deep, but within what JSON takes: harmless extra field
    ],
    ids=[
        "backbone-text",
        "negative-size",
        "names-lists",
        "names-numbers",
        "names-blank",
        "descriptions-number",
        "descriptions-count",
        "backbone-empty",
        "backbone-null",
        "deep-but-parsable",
    ],
)
def test_bad_upload_metadata_gets_400_and_changes_nothing(app, offline, lively_backbone, tmp_path, edit, message):
    before = files(tmp_path / "banks")
    sent = upload(lively_backbone, tmp_path, edit)
    response, answers = with_clean_requests(app, lambda http: http.put("/v1/banks/fresh", files=sent))
    assert_clean(offline, answers)
    if message is None:
        assert response.status_code == 200
        return
    assert response.status_code == 400 and message in response.json()["error"]["message"]
    assert files(tmp_path / "banks") == before


def test_metadata_nested_too_deep_for_json_gets_400(app, offline, lively_backbone, tmp_path):
    before = files(tmp_path / "banks")
    sent = upload(lively_backbone, tmp_path)
    sent["metadata"] = sent["metadata"][:-1] + b', "x": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    response, answers = with_clean_requests(app, lambda http: http.put("/v1/banks/fresh", files=sent))
    assert response.status_code == 400 and "RecursionError" in response.json()["error"]["message"]
    assert_clean(offline, answers)
    assert files(tmp_path / "banks") == before


def test_rows_too_large_for_the_backbone_are_refused(app, offline, lively_backbone, tmp_path):
    before = files(tmp_path / "banks")
    sent = upload(lively_backbone, tmp_path, rows=3e38 / 64)
    response, answers = with_clean_requests(app, lambda http: http.put("/v1/banks/fresh", files=sent))
    assert response.status_code == 400 and "with norms over" in response.json()["error"]["message"]
    assert_clean(offline, answers)
    assert files(tmp_path / "banks") == before


def test_a_directory_where_the_bank_would_go_gets_409_and_nothing_is_written(app, offline, lively_backbone, tmp_path):
    (tmp_path / "banks" / "x.safetensors").mkdir()
    before = files(tmp_path / "banks")
    sent = upload(lively_backbone, tmp_path)
    response, answers = with_clean_requests(app, lambda http: http.put("/v1/banks/x", files=sent))
    assert response.status_code == 409 and "not a bank file" in response.json()["error"]["message"]
    assert_clean(offline, answers)
    assert files(tmp_path / "banks") == before


# ---- auth and exposure ------------------------------------------------------------------------------------
def test_the_key_is_checked_before_a_malformed_body_is_read(lively_backbone, tmp_path, offline):
    app, _ = serve(lively_backbone, tmp_path / "banks", api_key="secret")
    headers = {"content-type": "multipart/form-data; boundary=x"}
    response = call(app, lambda client, http: http.put("/v1/banks/alpha", content=b"--x\r\nbroken", headers=headers))
    assert response.status_code == 401 and response.json()["error"]["type"] == "authentication_error"


def test_protect_all_needs_the_key_on_every_v1_route_but_not_on_health(lively_backbone, tmp_path, offline):
    app, engine = serve(lively_backbone, tmp_path / "banks", api_key="secret", protect="all")

    async def scenario(client, http):
        refused = [
            await http.get("/v1/models"),
            await http.post("/v1/completions", json={"model": "alpha", "prompt": "hi"}),
        ]
        keyed = openai.AsyncOpenAI(base_url="http://tokmem/v1", api_key="secret", http_client=http, max_retries=0)
        answer = await keyed.completions.create(
            model="alpha", prompt=CLEAN[0][1], max_tokens=10, extra_body={"threshold": 0.0}
        )
        return refused, answer, await http.get("/health")

    engine.start()
    try:
        refused, answer, health = call(app, scenario)
    finally:
        engine.stop()
    assert [r.status_code for r in refused] == [401, 401] and health.status_code == 200
    assert answer.choices[0].text == expected(offline, *CLEAN[0], threshold=0.0).text


@pytest.mark.parametrize(
    "host, key, warned",
    [
        ("0.0.0.0", None, True),
        ("192.168.1.5", None, True),
        ("::", None, True),
        ("127.0.0.1", None, False),
        ("::1", None, False),
        ("localhost", None, False),
        ("0.0.0.0", "k", False),
    ],
)
def test_open_management_on_a_reachable_host_is_warned_about(host, key, warned):
    warning = exposure_warning(ServeConfig(banks="b", host=host, api_key=key))
    assert (warning is not None) == warned
    if warned:
        assert "--api-key" in warning and host in warning


def test_a_404_does_not_list_the_banks(app):
    response = call(app, lambda client, http: http.post("/v1/completions", json={"model": "nope", "prompt": "hi"}))
    assert response.status_code == 404 and "alpha" not in response.text and "beta" not in response.text


# ---- the directory is the truth -----------------------------------------------------------------------------
def test_a_bank_removed_or_replaced_on_disk_is_forgotten_or_reloaded(app, offline, lively_backbone, tmp_path):
    banks = tmp_path / "banks"
    replacement = write_bank(lively_backbone, tmp_path / "other" / "beta.safetensors", rows=2, seed=11)

    async def scenario(client, http):
        ask = {"prompt": CLEAN[0][1], "max_tokens": 10, "threshold": 0.0}
        before = [await http.post("/v1/completions", json={"model": name, **ask}) for name in ("alpha", "beta")]
        for suffix in ("", ".json"):
            (banks / f"alpha.safetensors{suffix}").unlink()
            shutil.copy(tmp_path / "other" / f"beta.safetensors{suffix}", banks / f"beta.safetensors{suffix}")
        after = [await http.post("/v1/completions", json={"model": name, **ask}) for name in ("alpha", "beta")]
        return before, after, await http.delete("/v1/banks/alpha"), await http.get("/v1/models/alpha")

    before, (gone, replaced), deleted, retrieved = call(app, scenario)
    assert [r.status_code for r in before] == [200, 200]
    assert gone.status_code == deleted.status_code == retrieved.status_code == 404
    assert (
        replaced.json()["choices"][0]["text"]
        == expected({"beta": replacement}, "beta", CLEAN[0][1], threshold=0.0).text
    )
    assert replaced.json()["tokmem"]["bank_revision"] != before[1].json()["tokmem"]["bank_revision"]


def test_a_bank_on_disk_that_does_not_validate_is_a_server_error_that_names_no_folder(
    app, offline, lively_backbone, tmp_path
):
    model = write_bank(lively_backbone, tmp_path / "banks" / "huge.safetensors", rows=1)
    model.bank.index[:] = 3e38 / 64
    model.bank.save(tmp_path / "banks" / "huge.safetensors")
    response, answers = with_clean_requests(
        app, lambda http: http.post("/v1/completions", json={"model": "huge", "prompt": "hi"})
    )
    assert response.status_code == 500 and "does not validate" in response.json()["error"]["message"]
    assert str(tmp_path) not in response.text
    assert_clean(offline, answers)


def test_models_retrieve_gives_one_bank_or_404(app):
    async def scenario(client, http):
        with pytest.raises(openai.NotFoundError):
            await client.models.retrieve("nope")
        return await client.models.retrieve("beta")

    model = call(app, scenario)
    assert model.id == "beta" and model.owned_by == "tokmem" and model.model_extra["parent"] == "tiny-random-x20"


# ---- slow clients -------------------------------------------------------------------------------------------
def test_a_body_slower_than_the_deadline_gets_408(lively_backbone, tmp_path, offline):
    app, _ = serve(lively_backbone, tmp_path / "banks", body_timeout=0.2)
    sent, chunks = [], [{"type": "http.request", "body": b'{"model": "alpha", ', "more_body": True}]

    async def receive():
        if chunks:
            return chunks.pop()
        await asyncio.sleep(3600)  # the rest of the body never comes

    async def send(message):
        sent.append(message)

    scope = COMPLETION_SCOPE
    asyncio.run(asyncio.wait_for(app(scope, receive, send), timeout=60))
    assert sent[0]["status"] == 408
    assert "limit of 0.2 s" in json.loads(b"".join(m.get("body", b"") for m in sent[1:]))["error"]["message"]


def test_connections_with_unfinished_headers_are_closed_and_their_number_is_bounded(lively_backbone, tmp_path, offline):
    app, _ = serve(lively_backbone, tmp_path / "banks")
    with loopback(app, header_timeout=1.0, max_connections=2) as (host, port):
        slow = [socket.create_connection((host, port), timeout=30) for _ in range(2)]
        for connection in slow:
            connection.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # never finished
        with socket.create_connection((host, port), timeout=30) as third:
            third.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            refused = third.recv(4096)
        closed = [connection.recv(4096) for connection in slow]  # blocks until the server closes them
        with socket.create_connection((host, port), timeout=30) as later:
            later.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            answered = later.recv(4096)
    assert refused.startswith(b"HTTP/1.1 503") and closed == [b"", b""] and answered.startswith(b"HTTP/1.1 200")


def test_a_connection_with_an_unfinished_body_gets_408_and_is_closed(lively_backbone, tmp_path, offline):
    app, _ = serve(lively_backbone, tmp_path / "banks", body_timeout=0.5)
    with loopback(app) as (host, port), socket.create_connection((host, port), timeout=30) as slow:
        slow.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
        )
        received = b""
        while chunk := slow.recv(4096):  # until the server closes the connection
            received += chunk
    assert received.startswith(b"HTTP/1.1 408") and b"limit of 0.5 s" in received
