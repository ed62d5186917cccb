"""Schemathesis (pinned in requirements.txt) over the app in-process (ASGI): requests generated from the server's own
OpenAPI document, valid and invalid, on tiny-random banks with a tool bank.  No answer is a 5xx and every answer
conforms to the document (its status, content type, headers and body); what the document calls invalid gets a 4xx.
(A request valid by the document may still get 400: whether a conversation is well formed, or a tool is in the
bank, is not a schema's to say, so Schemathesis's positive-data check is left out.)  Bounded and derandomised: ``EXAMPLES`` examples of valid requests and as many of invalid ones (across the routes), the whole module well under a minute on two cores."""

import pytest
import schemathesis
from helpers import call, fuzz_settings, serve, write_served_banks, write_tool_bank
from hypothesis import given
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

EXAMPLES = 150


@pytest.fixture(scope="module")
def api(lively_backbone, tmp_path_factory):
    directory = tmp_path_factory.mktemp("banks")
    write_served_banks(lively_backbone, directory)
    write_tool_bank(lively_backbone, directory / "tools.safetensors")
    app, _ = serve(lively_backbone, directory, max_new_tokens=16, default_max_tokens=8, max_prompt_tokens=300)
    return schemathesis.openapi.from_asgi("/openapi.json", app)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_generated_requests_get_no_5xx_and_answers_that_conform_to_the_openapi_document(api, mode):
    @fuzz_settings(EXAMPLES)
    @given(api.as_strategy(mode))
    def one(case):
        case.call_and_validate(excluded_checks=[positive_data_acceptance])

    one()


@pytest.fixture(scope="module")
def app(lively_backbone, tmp_path_factory):
    directory = tmp_path_factory.mktemp("banks")
    write_tool_bank(lively_backbone, directory / "tools.safetensors")
    return serve(lively_backbone, directory)[0]


def test_the_document_lists_each_routes_statuses_its_event_stream_and_typed_fields(app):
    document = app.openapi()
    chat = document["paths"]["/v1/chat/completions"]["post"]
    assert set(chat["responses"]) == {"200", "400", "401", "404", "408", "413", "429", "500", "504"}
    assert chat["responses"]["400"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ErrorBody"
    }
    assert set(chat["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
    assert all("422" not in op["responses"] for ops in document["paths"].values() for op in ops.values())
    fields = document["components"]["schemas"]["ChatBody"]["properties"]
    assert (
        "integer" in [t["type"] for t in fields["seed"]["anyOf"]] and {"type": "boolean"} in fields["logprobs"]["anyOf"]
    )
    assert fields["top_p"] == {**fields["top_p"], "type": "number", "maximum": 1.0}


def test_a_method_a_path_does_not_take_gets_405_with_the_methods_it_takes(app):
    async def scenario(client, http):
        return await http.get("/v1/banks/tools"), await http.post("/v1/models")

    bank, models = call(app, scenario)
    assert bank.status_code == 405 and bank.headers["allow"] == "DELETE, PUT"
    assert models.status_code == 405 and models.headers["allow"] == "GET"
    assert bank.json()["error"]["type"] == "invalid_request_error"


def test_errors_cut_what_they_echo_of_long_input(app):
    names = [{"type": "function", "function": {"name": f"missing_tool_{i:04d}" + "x" * 150}} for i in range(4096)]
    body = {"model": "tools", "messages": [{"role": "user", "content": "hi"}], "tools": names}

    async def scenario(client, http):
        return await http.post("/v1/chat/completions", json=body), await http.get("/v1/models/" + "b" * 20_000)

    unknown, long_name = call(app, scenario)
    assert unknown.status_code == 400 and "and 4086 more" in unknown.json()["error"]["message"]
    assert len(unknown.content) < 3000
    assert long_name.status_code == 400 and len(long_name.content) < 1000
    assert "(20002 characters)" in long_name.json()["error"]["message"]
