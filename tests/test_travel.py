"""The shipped travel example (examples/travel/) on the real smollm2-135m: ``tokmem train`` with no tuning flags
routes the held-out queries, and after a tool's result the model answers in words that use it.

Training picks its own budget here (135 updates: 3.6 min alone on this project's 2-core CPU), so these are ``slow``.
"""

import json
from pathlib import Path

import pytest

import tokmem
from tokmem import DecodeConfig
from tokmem.cli import main
from tokmem.data import load_examples
from tokmem.eval.evaluate import evaluate

pytestmark = pytest.mark.slow

TRAVEL = Path(__file__).parents[1] / "examples" / "travel"


@pytest.fixture(scope="module")
def travel(tmp_path_factory):
    """The bank ``tokmem train`` makes from the example's data and catalog, with no tuning flags."""
    bank = tmp_path_factory.mktemp("travel") / "travel.safetensors"
    data, catalog = TRAVEL / "train.jsonl", TRAVEL / "catalog.json"
    assert main(["train", "--data", str(data), "--catalog", str(catalog), "--out", str(bank), "--quiet"]) == 0
    return tokmem.load(bank, device="cpu")


@pytest.mark.xfail(
    reason="issue 38's goal, not met yet: measured routing 80% (16 of 20, 2 fallbacks) at the picked 135 updates "
    "(results/travel-eval.json; 80% again at 270)",
    strict=False,
)
def test_the_travel_tools_trained_with_no_tuning_flags_route_nine_in_ten_held_out_queries(travel):
    result = evaluate(travel, load_examples(TRAVEL / "heldout.jsonl"))
    assert result["routing_accuracy"] >= 0.9
    assert result["open_set_fallbacks"] <= 2


def test_after_a_weather_result_the_answer_in_words_gives_its_temperature(travel):
    call = {"name": "get_weather", "arguments": json.dumps({"city": "Lisbon", "unit": "celsius"})}
    result = {"city": "Lisbon", "temperature": 23, "unit": "celsius", "conditions": "sunny"}
    conversation = [
        {"role": "user", "content": "What's the weather in Lisbon?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "a", "type": "function", "function": call}]},
        {"role": "tool", "tool_call_id": "a", "content": json.dumps(result)},
    ]
    reply = tokmem.chat(travel, conversation, config=DecodeConfig(max_new_tokens=48))
    assert not reply.tool_calls and "23" in reply.content
