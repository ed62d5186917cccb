"""The routing fit of a kept bank (research/scripts/routing_fit.py): calls counted by their place in the record."""

import torch
from research.scripts import routing_fit

from tokmem.training.refit import RoutingStates
from tokmem.training.sequences import Encoded


class Model:
    vocab_size = 10


def test_the_routing_is_counted_right_by_the_calls_place():
    counted = routing_fit.by_place(chosen=[0, 1, 1, 0, 2], gold=[0, 1, 0, 0, 1], places=[1, 2, 1, 2, 3])
    assert counted == {"right": 3, "steps": 5, "by place": {"1": "1 of 2", "2": "2 of 2", "3": "0 of 1"}}


def test_each_call_is_placed_in_its_own_record_whether_or_not_an_answer_in_words_ends_it():
    encoded = [
        Encoded([1] * 5, [-100, 11, 3, 10, -2]),
        Encoded([1] * 4, [-100, 12, 4, 5]),
        Encoded([1] * 3, [10, 11, 12]),
    ]
    assert routing_fit.call_places(Model(), encoded) == [1, 2, 1, 1, 2, 3]


def test_the_answers_in_words_are_left_out_of_the_calls():
    found = RoutingStates(torch.arange(8.0).reshape(4, 2), torch.tensor([1, -1, 0, 2]), torch.zeros(4))
    calls = routing_fit.calls(found)
    assert calls.rows.tolist() == [1, 0, 2] and calls.states.tolist() == [[0, 1], [4, 5], [6, 7]]
