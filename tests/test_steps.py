"""A tool loop's answers scored step by step (``tokmem.eval.steps``): each answer against its own step's gold call."""

import json

import pytest

from tokmem.eval.metrics import call_text_scores
from tokmem.data.procedures import Example, Step, call_json
from tokmem.eval.steps import aligned_scores, gold_value_sources, outcome, outcomes, source, value_error


def call(name: str, **arguments) -> str:
    return json.dumps({"name": name, "arguments": arguments})


FIND, RENT = call("Find", city="Oslo"), call("Rent", car="C7", days=2)


def test_a_repeat_of_the_earlier_call_earns_pooled_credit_but_nothing_by_position():
    gold, answers = [[FIND, RENT]], [[FIND, FIND]]  # step 2 repeats step 1's call
    pooled = call_text_scores(gold, answers)
    aligned = aligned_scores(gold, answers)
    assert pooled["call_f1"]["avg"] == pytest.approx(100 * 2 / 4)  # {FIND, FIND} against {FIND, RENT}: one match
    assert aligned["call_f1"]["all"] == pytest.approx(50.0)  # step 1 right, step 2 wrong
    assert aligned["exact_steps"] == {"2": 1, "all": 1} and aligned["steps"] == {"2": 2, "all": 2}


def test_answers_in_another_order_score_nothing_by_position_though_the_pooled_f1_is_full():
    gold, answers = [[FIND, RENT]], [[RENT, FIND]]
    assert call_text_scores(gold, answers)["call_f1"]["avg"] == 100.0
    assert aligned_scores(gold, answers)["call_f1"]["all"] == 0.0


def test_a_step_without_a_call_lowers_recall_and_an_extra_call_lowers_precision():
    missing = aligned_scores([[FIND, RENT]], [[FIND, None]])
    assert missing["call_f1"]["all"] == pytest.approx(100 * 2 * 1 / (1 + 2))
    extra = aligned_scores([[FIND]], [[FIND, RENT]])  # end to end: one call too many
    assert extra["call_f1"]["all"] == pytest.approx(100 * 2 * 1 / (2 + 1)) and extra["exact_steps"]["all"] == 1


def test_tool_argument_and_routing_scores_are_each_by_position():
    wrong_days = call("Rent", car="C7", days=3)
    scores = aligned_scores([[FIND, RENT]], [[FIND, wrong_days]], routes=[["Find", "Find"]])
    assert scores["tool_f1"]["all"] == 100.0
    assert scores["arg_f1"]["all"] == 50.0 and scores["call_f1"]["all"] == 50.0
    assert scores["routing_f1"]["all"] == 50.0  # the second memory token chose Find where Rent was due


def test_records_are_bucketed_by_their_number_of_gold_calls_and_pooled_over_all_steps():
    scores = aligned_scores([[FIND], [FIND, RENT]], [[FIND], [None, RENT]])
    assert scores["call_f1"]["1"] == 100.0 and scores["call_f1"]["2"] == pytest.approx(100 * 2 / 3)
    assert scores["call_f1"]["all"] == pytest.approx(100 * 2 * 2 / (2 + 3))
    assert list(scores["call_f1"]) == ["1", "2", "all"]


def test_mismatched_answers_and_records_are_refused():
    with pytest.raises(ValueError, match="1 answers for 2 records"):
        aligned_scores([[FIND], [RENT]], [[FIND]])


@pytest.mark.parametrize(
    ("answer", "kind"),
    [
        (RENT, "exact"),
        (None, "no call"),
        ('{"name": "Rent", "arguments": {"car": ', "not a JSON call"),
        (FIND, "repeat"),
        (call("Book", car="C7", days=2), "wrong tool"),
        (call("Rent", car="C7"), "wrong key set"),
        (call("Rent", days=2, car="C8"), "wrong values"),
    ],
)
def test_each_per_step_answer_gets_one_outcome(answer, kind):
    assert outcome(RENT, answer, earlier=[FIND]) == kind


def test_a_gold_value_comes_from_the_query_the_last_result_an_older_one_or_nowhere():
    results = ['{"city_id": "OSL-1"}', '{"car": "C7"}']
    assert source("Oslo", "Rent a car in oslo", results) == "query"
    assert source("C7", "Rent a car", results) == "last result"
    assert source("OSL-1", "Rent a car", results) == "older result"
    assert source("2026-12-15", "Rent a car on December 15th", results) == "none"


def test_a_data_sets_gold_values_are_counted_by_where_each_could_be_read_before_its_step():
    example = Example(
        "Rent a car in Oslo on December 15th",
        (
            Step("city", call_json("city", {"name": "Oslo"}), result='{"city_id": "OSL-1"}'),
            Step("cars", call_json("cars", {"city_id": "OSL-1", "date": "2026-12-15"}), result='{"car": "C7"}'),
            Step("book", call_json("book", {"car": "C7", "city_id": "OSL-1"})),
            Step("note", "Booked."),  # no call: no values
        ),
    )
    assert gold_value_sources([example]) == {"query": 1, "last result": 2, "older result": 1, "none": 1}


def test_outcomes_count_steps_and_the_right_tools_values_by_source():
    record = {
        "query": "Find Oslo, then rent car C7 for 2 days.",
        "gold": [FIND, RENT, call("Pay", ref="R-9")],
        "results": ['{"cars": ["C7", "C8"]}', '{"ref": "R-9"}', '{"ok": true}'],
        "step": [FIND, call("Rent", car="C8", days=2), call("Pay", ref="R-1")],
    }
    found = outcomes([record])
    assert found["steps"] == {
        "exact": 1,
        "wrong tool": 0,
        "wrong key set": 0,
        "wrong values": 2,
        "repeat": 0,
        "not a JSON call": 0,
        "no call": 0,
    }
    assert found["wrong values, by source"] == {"query": 1, "last result": 1, "older result": 0, "none": 0}
    values = found["values of the right tool"]
    assert values["query"] == {"right": 2, "wrong": 1}  # Oslo, 2 right; C7 (in the query too) wrong
    assert values["last result"] == {"right": 0, "wrong": 1}


def test_a_wrong_tool_is_counted_by_where_it_stands_in_the_record_a_stage_skipped_stayed_at_or_foreign():
    pay = call("Pay", ref="R-9")
    record = {
        "query": "Find Oslo, then rent car C7 for 2 days, then pay.",
        "gold": [FIND, RENT, pay],
        "results": ["{}", "{}", "{}"],
        "step": [call("Rent", car="C7", days=2), call("Find", city="Rome"), call("Book", room=1)],
    }
    assert outcomes([record])["wrong tools, by place"] == {
        "a later step's": 1,  # Rent before Find: a stage skipped
        "an earlier step's": 1,  # Find again where Rent was due (not a verbatim repeat)
        "not in the record": 1,
    }


def test_a_wrong_key_set_is_counted_by_the_keys_it_left_out_and_added():
    record = {
        "query": "Rent car C7 for 2 days, cheapest first.",
        "gold": [call("Rent", car="C7", days=2, sort="price"), call("Rent", car="C7", days=2, sort="price")],
        "results": ["{}", "{}"],
        "step": [call("Rent", car="C7", days=2), call("Rent", car="C7", sort="price", insurance=True)],
    }
    assert outcomes([record])["wrong key sets, by key"] == {
        "left out": {"sort": 1, "days": 1},
        "added": {"insurance": 1},
    }


GOLD_CAR = {"lat": 41.8, "lon": 12.25, "date": "2024-11-16", "place": "Downtown, Boston", "ages": "6,8", "adults": 3}


@pytest.mark.parametrize(
    "key, given, kind",
    [
        ("ages", "", "empty"),
        ("lat", 12.25, "another key's"),  # latitude and longitude swapped
        ("date", "2024-11-15", "date shifted"),
        ("place", "Downtown", "cut or run on"),
        ("place", " downtown, boston", "cut or run on"),  # a stray space, another case
        ("adults", 2, "another number"),
        ("place", "Seattle", "other text of the context"),  # another item of the result
        ("ages", "{ages}", "elsewhere"),
    ],
)
def test_a_wrong_value_is_named_by_what_it_is_instead(key, given, kind):
    results = ['{"cities": ["Seattle", "Boston"]}']
    assert value_error(given, GOLD_CAR[key], GOLD_CAR, "Rent a car downtown, 3 adults.", results) == kind


def test_outcomes_count_each_wrong_value_of_the_right_tool_by_kind():
    record = {
        "query": "Find Oslo, then rent car C7 for 2 days.",
        "gold": [FIND, RENT],
        "results": ['{"cars": ["C7", "C8"]}', "{}"],
        "step": [call("Find", city="Osl"), call("Rent", car="C8", days=3)],
    }
    kinds = outcomes([record])["wrong values, by kind"]
    assert kinds == {
        "empty": 0,
        "another key's": 0,
        "date shifted": 0,
        "cut or run on": 1,
        "another number": 1,
        "other text of the context": 1,
        "elsewhere": 0,
    }
