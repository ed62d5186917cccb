"""Synthetic tool chains (tokmem.data.tool_chains): an adaptation set whose later calls read earlier results."""

import json

from tokmem.data.tool_chains import TOOLS, tool_chains
from tokmem.eval.steps import gold_value_sources


def test_a_seed_gives_the_same_chains_and_another_seed_other_ones():
    assert tool_chains(30, seed=3) == tool_chains(30, seed=3)
    assert [e.query for e in tool_chains(30, seed=3)] != [e.query for e in tool_chains(30, seed=4)]


def test_every_chain_calls_its_tools_with_a_result_after_each_call():
    chains = tool_chains(200)
    assert {p for e in chains for p in e.procedures} == TOOLS
    assert all(2 <= len(e.steps) <= 4 for e in chains)
    assert all(json.loads(s.response)["name"] == s.procedure and s.result is not None for e in chains for s in e.steps)


def test_later_calls_copy_ids_out_of_earlier_results_and_write_said_values_in_the_apis_form():
    chains = tool_chains(200)
    sources = gold_value_sources(chains)
    assert sources["last result"] + sources["older result"] > sources["query"]  # reading results is the point
    for example in chains:
        calls = [json.loads(s.response)["arguments"] for s in example.steps]
        for k, arguments in enumerate(calls):
            for key, value in arguments.items():
                if key.endswith("_id"):  # an id is never said by the user: it is read from an earlier result
                    assert value not in example.query and any(value in r for r in map(str, _results(example, k)))
                if key in ("date", "start_date", "end_date"):  # said in words, written as ISO
                    assert len(value) == 10 and value not in example.query


def test_the_item_picked_out_of_a_result_is_the_one_the_query_asks_for():
    for example in tool_chains(200):
        calls = {s.procedure: json.loads(s.response)["arguments"] for s in example.steps}
        results = {s.procedure: json.loads(s.result) for s in example.steps}
        if "Reserve_Table" in calls:
            best = max(results["Search_Restaurants"]["restaurants"], key=lambda r: r["rating"])
            assert calls["Reserve_Table"]["restaurant_id"] == best["restaurant_id"]
        if "Get_Train_Seat_Map" in calls:
            trains = results["Search_Trains"]["trains"]
            assert all(t["departure"] > calls["Search_Trains"]["departure_after"] for t in trains)
            earliest = min(trains, key=lambda t: t["departure"])
            assert calls["Get_Train_Seat_Map"]["train_id"] == earliest["train_id"]


def _results(example, k):
    return [s.result for s in example.steps[:k]]
