"""The routing fit of a kept bank (benchmarks/routing_fit.py): each step routed as tokmem.chat routes it."""

from helpers import load_script, random_rows

import tokmem
from tokmem import DecodeConfig, Example, Step
from tokmem.eval.tool_loop import conversation
from tokmem.studies.harness import progress_bar

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


def test_the_routing_is_counted_right_by_the_calls_place(lively_backbone):
    model = bank(lively_backbone, 0)
    names = routing_fit.routed(model, CHAIN)
    counted = routing_fit.routing_by_place(model, [CHAIN, CHAIN], progress_bar(False), "test")
    right = [int(name == step.procedure) for name, step in zip(names, CHAIN.steps)]
    assert counted == {
        "right": 2 * sum(right),
        "steps": 4,
        "by place": {"1": f"{2 * right[0]} of 2", "2": f"{2 * right[1]} of 2"},
    }
