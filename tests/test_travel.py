"""The shipped travel example (examples/travel/) on the real smollm2-135m: ``tokmem train`` with no tuning flags
routes the held-out queries, after a tool's result the model answers in words, and served by
``tokmem serve`` the bank drives the three example clients (``openai``, the Agents SDK, LangChain) to an answer.

Training picks its own budget here (160 updates: 4.5 min in float32 on this project's 2-core CPU alone), so these
are ``slow``.  The suite's float32 (``conftest``) is the dtype trained here, whatever the CPU: the routing bound
holds with margin there (the six-run table of ``research/scripts/travel_defaults.py``, research/docs/studies.md "Defaults on every
CPU": 97.5-100% in float32 and bf16, seeds 0-2, no fallback; this is its float32 seed-0 run).
"""

import json
import re

import pytest
from helpers import TRAVEL, loopback, serve, travel_script

import tokmem
from tokmem import DecodeConfig
from tokmem.cli import main
from tokmem.data import load_examples
from tokmem.eval.evaluate import evaluate

pytestmark = pytest.mark.slow

WEATHER_QUESTION = "What is the weather in Lisbon in celsius?"  # a phrasing none of the training templates has


@pytest.fixture(scope="module")
def travel_bank(tmp_path_factory):
    """The bank file ``tokmem train`` makes from the example's data and catalog, with no tuning flags, alone in its
    folder (a ``--banks`` folder for ``tokmem serve``)."""
    bank = tmp_path_factory.mktemp("banks") / "travel.safetensors"
    data, catalog = TRAVEL / "train.jsonl", TRAVEL / "catalog.json"
    assert main(["train", "--data", str(data), "--catalog", str(catalog), "--out", str(bank), "--quiet"]) == 0
    return bank


@pytest.fixture(scope="module")
def travel(travel_bank):
    return tokmem.load(travel_bank, device="cpu")


@pytest.fixture(scope="module")
def base_url(travel, travel_bank):
    """``tokmem serve`` on loopback over the trained bank's folder (its bank is ``model="travel"``), with the default
    schema budget: a bank of the server's own directory compiles however long it takes (3-13 s a schema with
    smollm2's 49k-token vocabulary on this project's busy CPU, past the 5 s that a client's schema gets)."""
    app, _ = serve(travel.backbone, travel_bank.parent)
    with loopback(app) as (host, port):
        yield f"http://{host}:{port}/v1"


def test_the_travel_tools_trained_with_no_tuning_flags_route_nine_in_ten_held_out_queries(travel):
    """Bound: 90%, three queries under the worst of the six runs (97.5%)."""
    result = evaluate(travel, load_examples(TRAVEL / "heldout.jsonl"), loop=False)  # routing: the first token
    assert result["routing_accuracy"] >= 0.9
    assert result["open_set_fallbacks"] <= 2


def answer_after_a_weather_result(travel):
    """The model's turn after a ``get_weather`` call for Lisbon and its result (23 degrees)."""
    call = {"name": "get_weather", "arguments": json.dumps({"city": "Lisbon", "unit": "celsius"})}
    result = {"city": "Lisbon", "temperature": 23, "unit": "celsius", "conditions": "sunny"}
    conversation = [
        {"role": "user", "content": "What's the weather in Lisbon?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "a", "type": "function", "function": call}]},
        {"role": "tool", "tool_call_id": "a", "content": json.dumps(result)},
    ]
    return tokmem.chat(travel, conversation, config=DecodeConfig(max_new_tokens=48))


def test_after_a_weather_result_the_model_answers_in_words(travel):
    reply = answer_after_a_weather_result(travel)
    assert not reply.tool_calls and reply.content.strip()


@pytest.mark.xfail(
    reason="not reliable on smollm2-135m: two trainings of the 160-example data both answered 'Lisbon is a "
    "beautiful city with a … climate' without the 23; 'How cold is Oslo right now?' got its temperature from both",
    strict=False,
)
def test_after_a_weather_result_the_answer_in_words_gives_its_temperature(travel):
    assert "23" in answer_after_a_weather_result(travel).content


def printed_calls_and_answer(out: str) -> tuple[list[str], str]:
    """What an example client printed: the tools it called (its ``  name(arguments)`` lines), and its final answer
    (the text after the last call)."""
    lines = out.splitlines()
    calls = [k for k, line in enumerate(lines) if re.fullmatch(r"  \w+\(.*\)", line)]
    answer = "\n".join(lines[calls[-1] + 1 :] if calls else lines).strip()
    return [lines[k].split("(")[0].strip() for k in calls], answer


@pytest.mark.parametrize("script", ["openai_loop", "agents_sdk", "langchain_agent"])
def test_each_example_client_calls_get_weather_and_ends_with_an_answer_in_words(base_url, script, capsys):
    """Whether the answer gives the tool's temperature varies with the training run (see the xfail above), so only
    a non-empty answer is asserted; the output is printed (``-rA``) to show what it said.  (A bank of this data that
    called ``get_weather`` again after its result looped under the Agents SDK until ``max_turns``, before the server
    decoded such a turn again without the repeated tool.)"""
    travel_script(script).main(["--base-url", base_url, "--model", "travel", "--question", WEATHER_QUESTION])
    out = capsys.readouterr().out
    calls, answer = printed_calls_and_answer(out)
    print(out)
    assert calls[:1] == ["get_weather"] and answer and "no final answer" not in answer
