"""Property-based fuzz of the HTTP API over loopback: request bodies drawn from the OpenAPI schema's request models
(plausible values for each field, or any JSON in its place), bank uploads with fuzzed metadata, odd names.

Whatever comes in: no 5xx, no hang (every answer within the client's timeout), no error or traceback in the
server's log, and a clean request sent over and over meanwhile always gets exactly its offline answer.
Bounded (a fixed number of examples, derandomised) to take some tens of seconds.
"""

import json
import logging
import threading
from urllib.parse import quote

import httpx2
import pytest
from helpers import (
    bank_files,
    expected,
    fuzz_settings,
    loopback,
    serve,
    write_bank,
    write_served_banks,
    write_tool_bank,
)
from hypothesis import given
from hypothesis import strategies as st

EXAMPLES = 400
BANKS = ["alpha", "beta", "gamma", "empty", "tools"]
CLEAN = {"model": "alpha", "prompt": "Reverse apple.", "max_tokens": 8, "threshold": 0.0}

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
TEXTS = st.text(max_size=60) | st.sampled_from(["Reverse apple.", "hi", "What is the weather like today?"])
TOOL_NAMES = st.sampled_from(["city", "count", "chat", "p0"]) | st.text(max_size=8)
CALLS = st.lists(
    st.fixed_dictionaries(
        {
            "id": st.sampled_from(["a", "b"]),
            "type": st.just("function"),
            "function": st.fixed_dictionaries(
                {
                    "name": TOOL_NAMES,
                    "arguments": st.sampled_from(['{"city":"Rome"}', '{"n":3}', "{}", "not json"])
                    | st.text(max_size=12),
                }
            ),
        }
    ),
    max_size=2,
)
MESSAGES = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["system", "developer", "user", "assistant", "tool"]),
            "content": TEXTS | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXTS}), max_size=2),
        },
        optional={"tool_calls": CALLS, "tool_call_id": st.sampled_from(["a", "b"])},
    ),
    min_size=1,
    max_size=3,
)
PLAUSIBLE = {
    "model": st.sampled_from(BANKS) | st.text(max_size=20),
    "messages": MESSAGES | MESSAGES.map(lambda m: [*m, {"role": "user", "content": "hi"}]),
    "prompt": TEXTS | st.lists(TEXTS, max_size=2),
    "procedure": st.sampled_from(["p0", "p1", "p9"]) | st.text(max_size=8),
    "tools": st.lists(
        st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries({"name": TOOL_NAMES})}),
        max_size=3,
    ),
    "tool_choice": st.sampled_from(["auto", "none", "required"])
    | TOOL_NAMES.map(lambda n: {"type": "function", "function": {"name": n}}),
}


def by_type(schema: dict):
    """Values of the types a schema property allows (its ``anyOf`` branches), at and past their bounds."""
    kinds = {branch.get("type") for branch in schema.get("anyOf", [schema])}
    options = [st.none()] if "null" in kinds else []
    if "integer" in kinds:
        options.append(st.integers(1, 16) | st.integers(-(2**70), 2**70))
    if "number" in kinds:
        options.append(st.floats(0, 2.5) | st.floats())
    if "boolean" in kinds:
        options.append(st.booleans())
    if "string" in kinds:
        options.append(st.text(max_size=20))
    return st.one_of(options) if options else JSON


def bodies(schema: dict):
    """Request bodies of one model: either the required fields and any others, each a plausible value of its
    type (at and past its bounds), or any fields with anything (any JSON) in them."""
    typed = {name: PLAUSIBLE.get(name, by_type(prop)) for name, prop in schema["properties"].items()}
    required = set(schema.get("required", []))
    return st.one_of(
        st.fixed_dictionaries(
            {k: typed[k] for k in required}, optional={k: v for k, v in typed.items() if k not in required}
        ),
        st.fixed_dictionaries({}, optional={name: value | JSON for name, value in typed.items()}),
    )


def names():
    return (st.sampled_from(["fresh", "fuzz", "nope", "..", "a/b"]) | st.text(max_size=12)).filter(
        lambda n: n != "alpha"
    )


def as_json(content: bytes) -> dict:
    """A body sent as JSON as it is (NaN and Infinity included, which Python's json writes)."""
    return {"content": content, "headers": {"content-type": "application/json"}}


def requests(openapi: dict, upload: tuple[bytes, dict]):
    """(method, path, keyword arguments for httpx) of every route."""
    schemas = openapi["components"]["schemas"]
    tensors, metadata = upload
    fuzzed_metadata = st.dictionaries(st.sampled_from(sorted(metadata)), JSON, max_size=2).map(
        lambda edit: {**metadata, **edit}
    )
    files = st.fixed_dictionaries(
        {
            "tensors": st.just(tensors) | st.binary(max_size=64),
            "metadata": fuzzed_metadata.map(lambda m: json.dumps(m).encode()) | st.binary(max_size=64),
        }
    )
    return st.one_of(
        bodies(schemas["ChatBody"]).map(
            lambda body: ("POST", "/v1/chat/completions", as_json(json.dumps(body).encode()))
        ),
        bodies(schemas["CompletionBody"]).map(
            lambda body: ("POST", "/v1/completions", as_json(json.dumps(body).encode()))
        ),
        st.binary(max_size=80).map(lambda raw: ("POST", "/v1/chat/completions", as_json(raw))),
        names().map(lambda name: ("GET", f"/v1/models/{quote(name, safe='')}", {})),
        st.tuples(names(), files).map(lambda job: ("PUT", f"/v1/banks/{quote(job[0], safe='')}", {"files": job[1]})),
        names().map(lambda name: ("DELETE", f"/v1/banks/{quote(name, safe='')}", {})),
    )


class Problems(logging.Handler):
    """Every log record at ERROR or above, and every one that carries a traceback."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        if record.levelno >= logging.ERROR or record.exc_info:
            self.records.append(self.format(record))


def clean_loop(base: str, stop: threading.Event, answers: list) -> None:
    with httpx2.Client(base_url=base, timeout=60) as client:
        while not stop.is_set():
            response = client.post("/v1/completions", json=CLEAN)
            answers.append(
                (
                    response.status_code,
                    response.json()["choices"][0]["text"] if response.status_code == 200 else response.text,
                )
            )


def fuzz(base: str, strategy, statuses: list) -> None:
    with httpx2.Client(base_url=base, timeout=30) as client:

        @fuzz_settings(EXAMPLES)
        @given(strategy)
        def one(job):
            method, path, options = job
            response = client.request(method, path, **options)
            statuses.append(response.status_code)
            assert response.status_code < 500, (job, response.text)
            assert "server_error" not in response.text, (job, response.text)

        one()


@pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")
def test_fuzzed_requests_never_get_5xx_hang_or_log_a_traceback_and_a_clean_request_stays_exact(
    lively_backbone, tmp_path
):
    (tmp_path / "banks").mkdir()
    offline = write_served_banks(lively_backbone, tmp_path / "banks")
    write_tool_bank(lively_backbone, tmp_path / "banks" / "tools.safetensors")
    write_bank(lively_backbone, tmp_path / "upload" / "bank.safetensors", rows=2)
    tensors, metadata = bank_files(tmp_path / "upload" / "bank.safetensors")
    app, _ = serve(lively_backbone, tmp_path / "banks", max_new_tokens=16, default_max_tokens=8, max_prompt_tokens=300)
    problems, stop, clean = Problems(), threading.Event(), []
    loggers = [logging.getLogger(), logging.getLogger("uvicorn")]
    for logger in loggers:
        logger.addHandler(problems)
    statuses = []
    try:
        with loopback(app) as (host, port):
            base = f"http://{host}:{port}"
            cleaner = threading.Thread(target=clean_loop, args=(base, stop, clean))
            cleaner.start()
            try:
                fuzz(base, requests(app.openapi(), (tensors, json.loads(metadata))), statuses)
            finally:
                stop.set()
                cleaner.join()
    finally:
        for logger in loggers:
            logger.removeHandler(problems)
    reference = expected(offline, "alpha", CLEAN["prompt"], max_tokens=8, threshold=0.0).text
    assert clean and set(clean) == {(200, reference)}
    assert problems.records == []
    assert len(statuses) >= EXAMPLES and {200, 400, 404} <= set(statuses), sorted(set(statuses))
