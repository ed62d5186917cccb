"""Metrics: answer matching, ROUGE-L, routing, multiset F1, tool calls, GSM8K answers, perplexity."""

import json
import math

import pytest

from tokmem.data.gsm8k import extract_final_number, gsm8k_compliant, gsm8k_strictly_compliant
from tokmem.eval import metrics
from tokmem.eval.metrics import (
    argument_f1,
    call_f1,
    call_scores,
    gold_calls,
    read_call,
    routing_f1,
    exact_match,
    gsm8k_exact_match,
    mean,
    multiset_f1,
    normalize_answer,
    parse_call,
    perplexity,
    rouge_l,
    routing_accuracy,
    tool_f1,
)


def call(name: str, **arguments) -> str:
    return json.dumps({"name": name, "arguments": arguments})


def test_mean_averages_and_is_zero_for_no_values():
    assert mean([1, 0, True, 1]) == 0.75
    assert mean([]) == 0.0


def test_normalize_answer_strips_and_collapses_whitespace():
    assert normalize_answer("  the \t answer\n\n is  42 ") == "the answer is 42"


def test_exact_match_ignores_whitespace_but_not_case_or_punctuation():
    assert exact_match(" Paris\n", "Paris") == 1.0
    assert exact_match("paris", "Paris") == 0.0
    assert exact_match("Paris.", "Paris") == 0.0


def test_rouge_l_is_lcs_f_measure_on_0_to_100_scale():
    # LCS 3 tokens: precision 3/3, recall 3/6, F = 2 * 1 * 0.5 / 1.5 = 2/3.
    assert rouge_l("the cat sat", "the cat sat on the mat") == pytest.approx(200 / 3)
    assert rouge_l("the cat sat", "the cat sat") == pytest.approx(100.0)


def test_rouge_l_stems_and_ignores_case_and_punctuation():
    assert rouge_l("Cats, running!", "cat run") == pytest.approx(100.0)


def test_rouge_l_takes_max_over_references():
    assert rouge_l("the cat sat", ["a dog barked", "the cat sat", "the cat sat on the mat"]) == pytest.approx(100.0)
    assert rouge_l("the cat sat", ["a dog barked", "the cat sat on the mat"]) == pytest.approx(200 / 3)


def test_rouge_l_of_empty_prediction_is_zero_not_crash():
    assert rouge_l("", ["the cat sat"]) == 0.0
    assert rouge_l("   ", "the cat sat") == 0.0


def test_rouge_l_without_references_is_an_error():
    with pytest.raises(ValueError, match="at least one reference"):
        rouge_l("the cat sat", [])


def test_rouge_scorer_is_built_once():
    assert metrics._rouge_scorer() is metrics._rouge_scorer()


def test_routing_accuracy_counts_none_as_wrong():
    assert routing_accuracy(["add", None, "sort", "add"], ["add", "sort", "sort", "sum"]) == 0.5


def test_routing_accuracy_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="3 predictions for 2 gold"):
        routing_accuracy(["a", "b", "c"], ["a", "b"])


def test_multiset_f1_counts_overlap_with_multiplicity():
    # Overlap {a, b} = 2; F1 = 2 * 2 / (3 + 3).
    assert multiset_f1(["a", "a", "b"], ["a", "b", "c"]) == pytest.approx(2 / 3)
    # One "a" matches; F1 = 2 * 1 / (2 + 1).
    assert multiset_f1(["a", "a"], ["a"]) == pytest.approx(2 / 3)
    assert multiset_f1(["b", "a"], ["a", "b"]) == 1.0


def test_multiset_f1_both_empty_is_one_and_one_empty_is_zero():
    assert multiset_f1([], []) == 1.0
    assert multiset_f1(["a"], []) == 0.0
    assert multiset_f1([], ["a"]) == 0.0


def test_parse_call_ignores_key_order_and_whitespace():
    compact = '{"name":"book","arguments":{"city":"Oslo","nights":2}}'
    spread = '\n {"arguments": {\n  "nights" : 2,  "city": "Oslo"\n },  "name": "book"}  '
    assert parse_call(compact) == parse_call(spread) == ("book", (("city", "Oslo"), ("nights", 2)))


def test_parse_call_treats_integral_float_as_int():
    assert parse_call(call("f", x=1)) == parse_call(call("f", x=1.0))
    assert parse_call(call("f", x=1)) != parse_call(call("f", x=1.5))


def test_parse_call_canonicalises_nested_lists_and_dicts():
    left = '{"name": "f", "arguments": {"q": {"b": [1.0, {"y": 2, "x": 3}], "a": null}}}'
    right = '{"name": "f", "arguments": {"q": {"a": null, "b": [1, {"x": 3, "y": 2.0}]}}}'
    assert parse_call(left) == parse_call(right)
    assert parse_call(left) != parse_call('{"name": "f", "arguments": {"q": {"a": null, "b": [{"x": 3, "y": 2}, 1]}}}')


def test_parse_call_accepts_python_literal_style():
    assert parse_call("{'name': 'f', 'arguments': {'on': True, 'tags': ['a', 'b']}}") == parse_call(
        call("f", tags=["a", "b"], on=True)
    )


def test_parsed_call_is_hashable():
    assert len({parse_call(call("f", x=[1, {"y": True}])), parse_call(call("f", x=[1.0, {"y": True}]))}) == 1


def test_bool_argument_is_not_equal_to_int():
    assert parse_call(call("f", x=True)) != parse_call(call("f", x=1))
    assert parse_call(call("f", x=False)) != parse_call(call("f", x=0))
    assert parse_call(call("f", x=["bool", 1])) != parse_call(call("f", x=True))


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not a call",
        '{"name": "f", "arguments": {"x": 1}',
        "[1, 2]",
        "null",
        '{"arguments": {"x": 1}}',
        '{"name": 3, "arguments": {}}',
        '{"name": "f"}',
        '{"name": "f", "arguments": [1]}',
        "{'name': 'f', 'arguments': {'x': print(1)}}",
    ],
)
def test_parse_call_returns_none_for_anything_but_a_call(text):
    assert parse_call(text) is None


def reads(*texts):
    """Predicted calls as ``read_call`` gives them."""
    return [read_call(text) for text in texts]


def test_tool_f1_scores_names_only():
    predicted = reads(call("search", q="cats"), call("weather", city="Oslo"))
    gold = gold_calls([call("search", q="dogs"), call("calendar", day=1)])
    # Names overlap on "search" only: F1 = 2 * 1 / (2 + 2).
    assert tool_f1(predicted, gold) == 0.5


def test_tool_f1_unparseable_call_contributes_no_name():
    gold = gold_calls([call("search", q="cats")])
    assert tool_f1(reads(call("search", q="cats"), "search(q='cats')"), gold) == 1.0
    assert tool_f1(reads("garbage"), gold) == 0.0


def test_a_call_that_does_not_parse_names_no_tool_and_no_arguments():
    assert read_call('{"name":"search","arguments":{"q": cats}') == (None, None)


def test_routing_f1_scores_the_memory_tokens_tools_against_the_gold_names():
    gold = gold_calls([call("search", q="cats"), call("weather", city="Oslo")])
    assert routing_f1(["search", "calendar"], gold) == 0.5


def test_argument_f1_ignores_key_order_and_whitespace():
    predicted = reads('{ "arguments": {"units": "C", "city": "Oslo"}, "name": "weather" }')
    assert argument_f1(predicted, gold_calls([call("weather", city="Oslo", units="C")])) == 1.0


def test_argument_f1_requires_equal_arguments():
    predicted = reads(call("weather", city="Oslo"), call("search", q="cats"))
    gold = gold_calls([call("weather", city="Bergen"), call("search", q="cats")])
    # Only the search call matches: F1 = 2 * 1 / (2 + 2).
    assert argument_f1(predicted, gold) == 0.5


def test_argument_f1_ignores_the_name_and_call_f1_needs_both():
    predicted = reads(call("weather_now", city="Oslo"))
    gold = gold_calls([call("weather", city="Oslo")])
    assert argument_f1(predicted, gold) == 1.0
    assert call_f1(predicted, gold) == 0.0
    assert call_f1(reads(call("weather", city="Oslo")), gold) == 1.0


def test_unparseable_call_counts_as_wrong_not_crash():
    gold = gold_calls([call("search", q="cats")])
    # The garbage prediction still counts as predicted: F1 = 2 * 1 / (2 + 1).
    assert argument_f1(reads(call("search", q="cats"), "search(q='cats')"), gold) == pytest.approx(2 / 3)
    assert argument_f1(reads("{", "None"), gold) == 0.0
    assert call_f1(reads("{"), gold) == 0.0


def test_unparseable_gold_call_is_an_error():
    with pytest.raises(ValueError, match="gold tool call does not parse"):
        gold_calls(["f()"])


def test_call_scores_bucket_by_the_number_of_gold_calls_and_average_over_the_buckets():
    a, b, c = call("f", x=1), call("g", y="s"), call("h", z=[1, 2])
    gold = [[a, b], [a, c], [a, b, c]]
    predicted = [reads(b, a), reads(a, call("h", z=[9])), reads(call("k", z=[1, 2]))]
    scores = call_scores(gold, predicted)
    assert scores["tool_f1"] == {"2": 100.0, "3": 0.0, "avg": 50.0}
    assert scores["arg_f1"] == {"2": pytest.approx(75.0), "3": 50.0, "avg": pytest.approx(62.5)}
    assert scores["call_f1"] == {"2": pytest.approx(75.0), "3": 0.0, "avg": pytest.approx(37.5)}


def test_call_scores_refuse_a_prediction_list_of_another_length():
    with pytest.raises(ValueError, match="2 predictions for 1 queries"):
        call_scores([[call("f", x=1)]], [[], []])


@pytest.mark.parametrize(
    "text",
    ["She has 5 left.\n#### 5", "#### 1,234\n", "#### -3.5", "#### $12", "####72  ", "#### +0.50"],
)
def test_gsm8k_strictly_compliant_accepts_answer_ending_with_marked_number(text):
    assert gsm8k_strictly_compliant(text)


@pytest.mark.parametrize(
    "text",
    ["The answer is 5", "#### 5 apples", "#### 5\nThen more text", "#### ", "#### 5.", "# 5", "#### five"],
)
def test_gsm8k_strictly_compliant_rejects_anything_else(text):
    assert not gsm8k_strictly_compliant(text)


@pytest.mark.parametrize(
    "text",
    ["She has 5 left.\n#### 5", "#### 5 apples", "#### 5\nThen more text", "#### five", "a #### b", "#### "],
)
def test_gsm8k_compliant_accepts_the_marker_and_a_space_anywhere(text):
    assert gsm8k_compliant(text)


@pytest.mark.parametrize("text", ["The answer is 5", "####72", "### 5", "# 5", "5 ####"])
def test_gsm8k_compliant_rejects_answers_without_the_marker_and_a_space(text):
    assert not gsm8k_compliant(text)


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("#### 1,234", "1234"),
        ("#### $12.00", "12"),
        ("#### 5.50 dollars", "5.5"),
        ("#### 100", "100"),
        ("#### 007", "7"),
        ("#### .5", "0.5"),
        ("#### -0", "0"),
        ("#### -0.0", "0"),
        ("#### +7", "7"),
        ("#### -$3", "-3"),
        ("#### 18.", "18"),
        ("#### The answer is 42", "42"),
        ("3 apples #### 3 #### 4", "4"),
        ("no marker, just 5", None),
        ("#### none", None),
    ],
)
def test_extract_final_number_normalises_the_last_marked_number(text, number):
    assert extract_final_number(text) == number


def test_gsm8k_exact_match_compares_normalised_final_numbers():
    reference = "Each box holds 250, so 4 boxes hold 1000.\n#### 1000"
    assert gsm8k_exact_match("4 * 250 = 1,000\n#### $1,000.00", reference) == 1.0
    assert gsm8k_exact_match("#### 999", reference) == 0.0
    assert gsm8k_exact_match("The answer is 1000", reference) == 0.0


def test_gsm8k_exact_match_rejects_reference_without_answer():
    with pytest.raises(ValueError, match="no '#### <number>' answer"):
        gsm8k_exact_match("#### 5", "five")


def test_perplexity_is_exp_of_mean_token_nll():
    assert perplexity(2 * math.log(4), 2) == pytest.approx(4.0)
    assert perplexity(0.0, 5) == 1.0


def test_perplexity_of_zero_tokens_is_a_clear_error():
    with pytest.raises(ValueError, match="at least one token"):
        perplexity(1.0, 0)
