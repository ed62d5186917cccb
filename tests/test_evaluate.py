import json

from tokmem.data.procedures import Example, Step
from tokmem.decode import Generation, Segment
from tokmem.eval.evaluate import are_tool_calls, tool_call_scores


def call(name, **arguments):
    return json.dumps({"name": name, "arguments": arguments})


GOLD = Example("Find hotels in Rome.", (Step("search", call("search", city="Rome")), Step("book", call("book", id=7))))


def test_call_scores_take_the_tool_from_the_memory_token_and_the_arguments_from_the_text():
    generation = Generation(
        GOLD.query,
        [Segment("search", call("search", city="Rome")), Segment("book", call("book", id=8))],
        memory_mass=1.0,
    )
    scores = tool_call_scores([GOLD], [generation])
    assert scores["tool_f1"] == {"2": 100.0, "avg": 100.0}
    assert scores["arg_f1"]["2"] == 50.0 and scores["call_f1"]["2"] == 50.0


def test_an_open_set_answer_is_scored_by_the_name_its_text_gives():
    generation = Generation(GOLD.query, [Segment(None, call("search", city="Rome"))], memory_mass=0.0, routed=False)
    scores = tool_call_scores([GOLD], [generation])
    assert round(scores["tool_f1"]["2"], 1) == 66.7 and round(scores["call_f1"]["2"], 1) == 66.7


def test_only_examples_whose_every_step_is_a_call_are_tool_calls():
    assert are_tool_calls([GOLD])
    assert not are_tool_calls([GOLD, Example("Reverse abc.", (Step("reverse", "cba"),))])
    assert not are_tool_calls([])
