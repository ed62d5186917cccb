import json

import pytest
from helpers import random_rows

import tokmem
from tokmem.data.procedures import Example, Step
from tokmem.decoding.decode import DecodeConfig, Generation, Segment, generate
from tokmem.eval import metrics
from tokmem.eval.evaluate import are_tool_calls, evaluate, score_calls
from research.methods.tokmem import TokMem
from tokmem.training.sequences import RESULT_TOKENS
from research.studies.harness import PhaseBars
from research.studies.tool_loop import loop_scores


def call(name, **arguments):
    return json.dumps({"name": name, "arguments": arguments})


GOLD = Example("Find hotels in Rome.", (Step("search", call("search", city="Rome")), Step("book", call("book", id=7))))


def test_call_scores_take_the_tool_from_the_memory_token_and_the_arguments_from_the_text():
    generation = Generation(
        GOLD.query,
        [Segment("search", call("search", city="Rome")), Segment("book", call("book", id=8))],
        memory_mass=1.0,
    )
    scores = score_calls([GOLD], [[s.text for s in generation.trace]], [generation.procedures])
    assert scores["tool_f1"] == {"2": 100.0, "avg": 100.0}
    assert scores["arg_f1"]["2"] == 50.0 and scores["call_f1"]["2"] == 50.0


def test_an_open_set_answer_is_scored_by_the_name_its_text_gives():
    generation = Generation(GOLD.query, [Segment(None, call("search", city="Rome"))], memory_mass=0.0, routed=False)
    scores = score_calls([GOLD], [[s.text for s in generation.trace]], [generation.procedures])
    assert round(scores["tool_f1"]["2"], 1) == 66.7 and round(scores["call_f1"]["2"], 1) == 66.7


def test_only_examples_whose_every_step_is_a_call_are_tool_calls():
    assert are_tool_calls([GOLD])
    assert not are_tool_calls([GOLD, Example("Reverse abc.", (Step("reverse", "cba"),))])
    assert not are_tool_calls([])


def test_parsed_calls_match_exactly_whatever_their_spacing_and_key_order():
    gold = ['{"name":"f","arguments":{"a":1,"b":2}}']
    assert metrics.calls_exact_match(['{"arguments": {"b": 2, "a": 1.0}, "name": "f"}'], gold) == 1.0
    assert metrics.calls_exact_match(['{"name": "f", "arguments": {"a": 1, "b": 3}}'], gold) == 0.0
    assert metrics.calls_exact_match([], gold) == 0.0


CITY = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Oslo", "Rome"]}}, "required": ["city"]}
COUNT = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
WITH_RESULTS = [
    Example(
        "Weather in Rome, then count.",
        (Step("city", call("city", city="Rome"), result="sunny"), Step("count", call("count", n=3), result="3")),
    ),
    Example("Weather in Oslo?", (Step("city", call("city", city="Oslo"), result="rain"),)),
]


@pytest.fixture
def tool_model(lively_backbone):
    model = tokmem.create(lively_backbone)
    model.bank.add(["city", "count"], lively_backbone.mean_embedding(), kinds=["tool", "tool"], schemas=[CITY, COUNT])
    random_rows(model.bank, scale=0.7)
    return model


def test_chains_with_results_are_scored_step_by_step_and_end_to_end_as_the_tool_loop_study_scores(tool_model):
    config = DecodeConfig(max_new_tokens=40)
    result = evaluate(tool_model, WITH_RESULTS, config)
    study = loop_scores(TokMem.trained(tool_model, config), WITH_RESULTS, 3, RESULT_TOKENS, PhaseBars(False))
    assert result["calls_per_step"] == study["step"]
    assert result["calls"]["call_f1"] == study["end_to_end"]["call_f1"]
    for row, sample in zip(result["predictions"], study["samples"]):
        assert row["answer"] == "\n".join(sample["end_to_end"])  # the loop's calls, not one generation without results
        assert row["exact_match"] == metrics.calls_exact_match(sample["end_to_end"], sample["gold"])


def test_tool_data_without_results_is_generated_whole_and_has_no_per_step_scores(tool_model):
    plain = [Example(e.query, tuple(Step(s.procedure, s.response) for s in e.steps)) for e in WITH_RESULTS]
    result = evaluate(tool_model, plain, DecodeConfig(max_new_tokens=40))
    assert result["calls_per_step"] is None and result["calls"] is not None
    assert [row["answer"] for row in result["predictions"]] == [
        g.text for g in generate(tool_model, [e.query for e in plain], DecodeConfig(max_new_tokens=40))
    ]
