"""The routing fit of a kept bank (benchmarks/routing_fit.py): each step routed as tokmem.chat routes it."""

from helpers import load_script, random_rows

import tokmem
from tokmem import DecodeConfig, Example, Step
from tokmem.eval.tool_loop import conversation

routing_fit = load_script("routing_fit")

CITY = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Oslo", "Rome"]}}, "required": ["city"]}
COUNT = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
CHAIN = Example(
    "Weather in Rome, then count.",
    (
        Step("city", '{"name":"city","arguments":{"city":"Rome"}}', result="sunny"),
        Step("count", '{"name":"count","arguments":{"n":3}}', result="3 apples"),
    ),
)


def bank(backbone, seed: int):
    model = tokmem.create(backbone)
    model.bank.add(
        ["city", "count", "chat"],
        backbone.mean_embedding(),
        kinds=["tool", "tool", "text"],
        schemas=[CITY, COUNT, None],
    )
    random_rows(model.bank, scale=0.7, seed=seed)
    return model


def test_each_step_routes_to_the_tool_chat_calls_first_under_required_with_the_gold_steps_before_it(lively_backbone):
    seen = set()
    for seed in range(4):
        model = bank(lively_backbone, seed)
        chat_first = [
            tokmem.chat(
                model,
                conversation(CHAIN, [(s.response, s.result) for s in CHAIN.steps[:k]]),
                tool_choice="required",
                config=DecodeConfig(max_new_tokens=40),
            )
            .tool_calls[0]
            .name
            for k in range(len(CHAIN.steps))
        ]
        assert routing_fit.routed(model, CHAIN) == chat_first
        seen.update(chat_first)
    assert seen == {"city", "count"}  # the rows route differently: the agreement is not one constant answer


def test_the_routing_is_counted_right_by_the_calls_place():
    counted = routing_fit.by_place(chosen=[0, 1, 1, 0, 2], gold=[0, 1, 0, 0, 1], places=[1, 2, 1, 2, 3])
    assert counted == {"right": 3, "steps": 5, "by place": {"1": "1 of 2", "2": "2 of 2", "3": "0 of 1"}}


def test_rows_refit_on_the_states_route_each_to_its_gold_tool_where_the_banks_rows_did_not(lively_backbone):
    model = bank(lively_backbone, 0)
    states = routing_fit.step_states(model, CHAIN)
    swapped = [1 - model.bank.names.index(step.procedure) for step in CHAIN.steps]  # each step the other tool
    assert routing_fit.chosen_rows(model, states, model.memory_matrices()[0]) != swapped
    refit = routing_fit.refit_rows(model, states, swapped, steps=300)
    assert routing_fit.chosen_rows(model, states, refit) == swapped
