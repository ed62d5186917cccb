"""The travel agent check (research/scripts/travel_agent.py): an answer quotes a result when it writes a value the result
gave and the question did not."""

import json

from research.scripts import travel_agent

FLIGHT = json.dumps({"flights": [{"flight": "MA164", "origin": "Oslo", "price": 872, "direct": True}]})


def test_an_answer_that_writes_a_results_value_quotes_it():
    question = "Find me a flight from Oslo to Rome."
    assert travel_agent.quotes_a_result(question, [FLIGHT], "Flight ma164 leaves Oslo; it costs 872 EUR.")
    assert travel_agent.quotes_a_result(question, ['{"temperature": 9.5}'], "It is 9.5 degrees.")


def test_an_answer_that_only_repeats_the_question_or_writes_other_numbers_quotes_nothing():
    question = "Find me a flight from Oslo to Rome."
    assert not travel_agent.quotes_a_result(question, [FLIGHT], "There is a flight from Oslo to Rome.")
    assert not travel_agent.quotes_a_result(question, [FLIGHT], "It costs 8721 EUR, or 87.2 per seat.")
    assert not travel_agent.quotes_a_result(question, [], "Flight MA164 costs 872 EUR.")
