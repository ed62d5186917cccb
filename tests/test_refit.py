"""The index refit (tokmem.training.refit, ``TrainConfig.refit_index``): the routing side fitted to the states the
training sequences reach, the steering left as trained."""

import time
from dataclasses import asdict, replace

import pytest
import torch
from helpers import CITY, COUNT, tool_bank

import tokmem
from tokmem import DecodeConfig, Example, Step
from tokmem.decoding.tool_rules import tool_routing
from tokmem.eval.tool_loop import conversation
from research.methods.tokmem import TokMem
from tokmem.training.refit import refit_index, routing_states
from research.studies.harness import MethodResult
from tokmem.training.train import TrainConfig, encode_examples

CHAINS = [
    Example(
        "Weather in Rome, then count.",
        (
            Step("city", '{"name":"city","arguments":{"city":"Rome"}}', result="sunny"),
            Step("count", '{"name":"count","arguments":{"n":3}}', result="3 apples"),
        ),
    ),
    Example(
        "Count to two, then the weather in Oslo.",
        (
            Step("count", '{"name":"count","arguments":{"n":2}}', result="2 pears"),
            Step("city", '{"name":"city","arguments":{"city":"Oslo"}}', result="rain"),
        ),
    ),
]


def required_routes(model, found) -> list[str]:
    tools = tool_routing(model, None, "required", 0.0)[0].cpu()
    rows = (found.states @ model.bank.index.T).masked_fill(~tools, float("-inf")).argmax(-1)
    return [model.bank.names[r] for r in rows[found.rows >= 0]]


def test_the_states_read_once_a_sequence_route_each_call_as_chat_does_with_the_gold_steps_before_it(lively_backbone):
    seen = set()
    for seed in range(4):
        model = tool_bank(lively_backbone, seed=seed)
        chat_first = [
            tokmem.chat(
                model,
                conversation(example, [(s.response, s.result) for s in example.steps[:k]]),
                tool_choice="required",
                config=DecodeConfig(max_new_tokens=40),
            )
            .tool_calls[0]
            .name
            for example in CHAINS
            for k in range(len(example.steps))
        ]
        found = routing_states(model, encode_examples(model, CHAINS, TrainConfig()), batch_size=2, progress=False)
        assert required_routes(model, found) == chat_first
        seen.update(chat_first)
    assert seen == {"city", "count"}  # the rows route differently: the agreement is not one constant answer


def test_each_calls_label_is_its_row_and_an_answer_after_the_last_result_is_the_vocabulary(lively_backbone):
    model = tool_bank(lively_backbone)
    found = routing_states(model, encode_examples(model, CHAINS, TrainConfig()), progress=False)
    city, count = model.bank.row("city"), model.bank.row("count")
    assert found.rows.tolist() == [city, count, -1, count, city, -1]  # each record ends with a result: answer in words
    assert found.states.shape == (6, lively_backbone.hidden_size) and found.words.shape == (6,)


@pytest.mark.parametrize("seed", range(4))
def test_refit_routes_every_training_call_and_keeps_what_the_rows_steer(lively_backbone, seed):
    model = tool_bank(lively_backbone, seed=seed)
    model.bank.freeze()
    model.bank.trainable[:2] = True  # the tools are this round's rows; the text row is old, and stays
    steer, chat_row = model.bank.index.clone(), model.bank.index[2].clone()
    found = routing_states(model, encode_examples(model, CHAINS, TrainConfig()), progress=False)
    report = refit_index(model, found)
    assert report["states"] == 6 and report["routed_after"] > report["routed_before"]
    calls = found.rows >= 0  # an answer in words may stay with the old text row, which the refit does not move
    assert torch.equal(found.logits(model.bank.index).argmax(1)[calls], found.rows[calls] + 1)
    assert model.bank.decoupled
    assert torch.equal(model.bank.steer, steer)  # the memory tokens steer the arguments as trained
    assert torch.equal(model.bank.index[2], chat_row)
    assert not torch.equal(model.bank.index[:2], steer[:2])


def test_learn_with_refit_index_leaves_a_decoupled_bank_whose_states_route_right(lively_backbone):
    model = tokmem.create(lively_backbone)
    config = TrainConfig(max_steps=2, batch_size=2, progress=False, refit_index=True, lr=1e-2)
    report = tokmem.learn(model, CHAINS, config, schemas={"city": CITY, "count": COUNT})
    assert model.bank.decoupled and not model.bank.trainable.any()
    assert report.summary()["refit"]["states"] == 6 and report.summary()["refit"]["routed_after"] == 6
    found = routing_states(model, encode_examples(model, CHAINS, config), progress=False)
    assert found.routed(model.bank.index) == 6
    unrefit = tokmem.create(lively_backbone)
    tokmem.learn(unrefit, CHAINS, replace(config, refit_index=False), schemas={"city": CITY, "count": COUNT})
    assert torch.equal(model.bank.steer, unrefit.bank.index)  # the same training; only the routing side refit


def test_a_study_records_the_refit_of_tokmems_last_round_and_nothing_without_one(lively_backbone):
    config = TrainConfig(max_steps=2, batch_size=2, progress=False, refit_index=True, lr=1e-2)
    schemas = {"city": CITY, "count": COUNT}
    method = TokMem(lively_backbone, config, schemas=schemas)
    method.learn(CHAINS)
    recorded = asdict(MethodResult.of(method, time.perf_counter()))["learn_report"]
    assert recorded["refit"]["states"] == 6 and recorded["refit"]["routed_after"] == 6
    plain = TokMem(lively_backbone, replace(config, refit_index=False), schemas=schemas)
    plain.learn(CHAINS)
    assert MethodResult.of(plain, time.perf_counter()).learn_report is None


def test_a_study_records_the_training_sequences_max_length_cut(lively_backbone):
    """A study's TokMem row says when its records did not fit (the tokmem+schema row once trained on 61 of 120
    records cut down to one query token, unseen)."""
    config = TrainConfig(max_steps=1, batch_size=2, progress=False, max_length=24)
    method = TokMem(lively_backbone, config, schemas={"city": CITY, "count": COUNT})
    method.learn(CHAINS)
    cut = MethodResult.of(method, time.perf_counter()).learn_report["truncated"]
    assert cut["sequences"] == len(CHAINS) and cut["queries"] + cut["responses"] >= len(CHAINS)
    assert "refit" not in method.learn_report
