"""Key-set rows (tokmem.bank.key_sets, ``TrainConfig.key_sets``): a tool's training key sets, one chosen by the state
that routed the tool, its arguments then bound to exactly those keys — offline, served and in the bank file."""

import json

import pytest
import torch
from helpers import call, serve

import tokmem
from tokmem import DecodeConfig, Example, Step
from tokmem.errors import BankError
from tokmem.bank.key_sets import KeySets
from tokmem.training.refit import FIT_ITERATIONS, call_key_sets, logistic_regression, routing_states
from tokmem.training.train import TrainConfig, encode_examples

HOTEL = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Oslo", "Rome"]},
        "stars": {"type": "integer", "enum": [3, 4, 5]},
        "pets": {"type": "boolean"},
    },
    "required": ["city"],
}
PLAIN, STARRED = ("city",), ("city", "stars")
ASK = [{"role": "user", "content": "A hotel in Rome."}]
CONFIG = DecodeConfig(max_new_tokens=40)


def hotel_model(backbone):
    model = tokmem.create(backbone)
    model.bank.add(["hotel"], backbone.mean_embedding(), kinds=["tool"], schemas=[HOTEL])
    return model


def with_key_sets(model, weight, bias):
    model.bank.key_sets[0] = KeySets([PLAIN, STARRED], weight, torch.tensor(bias))
    return model


def hotel_keys(model, messages=ASK) -> set:
    reply = tokmem.chat(model, messages, tool_choice="required", config=CONFIG)
    return set(json.loads(reply.tool_calls[0].arguments))


def routing_state(model) -> torch.Tensor:
    """The state before the hotel's memory token after ``ASK``, as training lays the query out."""
    example = Example(ASK[0]["content"], (Step("hotel", '{"name":"hotel","arguments":{"city":"Rome"}}'),))
    return routing_states(model, encode_examples(model, [example], TrainConfig()), progress=False).states[0]


@pytest.mark.parametrize("bias, keys", [([0.0, 5.0], set(STARRED)), ([5.0, 0.0], set(PLAIN))])
def test_the_arguments_are_bound_to_the_key_set_the_rows_choose(lively_backbone, bias, keys):
    model = with_key_sets(hotel_model(lively_backbone), torch.zeros(2, lively_backbone.hidden_size), bias)
    assert hotel_keys(model) == keys


@pytest.mark.parametrize("first", [0, 1])
def test_the_state_that_routed_the_tool_chooses_its_key_set(lively_backbone, first):
    model = hotel_model(lively_backbone)
    state = routing_state(model)
    weight = torch.stack([state, -state] if first == 0 else [-state, state])
    assert hotel_keys(with_key_sets(model, weight, [0.0, 0.0])) == set((PLAIN, STARRED)[first])


def test_a_client_schema_without_the_chosen_keys_decodes_under_its_own_schema(lively_backbone):
    model = with_key_sets(hotel_model(lively_backbone), torch.zeros(2, lively_backbone.hidden_size), [0.0, 5.0])
    no_stars = {**HOTEL, "properties": {"city": HOTEL["properties"]["city"]}}
    tools = [{"type": "function", "function": {"name": "hotel", "parameters": no_stars}}]
    reply = tokmem.chat(model, ASK, tools=tools, tool_choice="required", config=CONFIG)
    assert set(json.loads(reply.tool_calls[0].arguments)) == set(PLAIN)  # the only key set it admits


def training_examples() -> list[Example]:
    """Hotel calls whose query says whether they carry ``stars``."""
    examples = []
    for k, city in enumerate(["Oslo", "Rome"] * 4):
        arguments = {"city": city, "stars": 3 + k % 3} if k % 2 else {"city": city}
        query = f"A {arguments['stars']}-star hotel in {city}, please." if k % 2 else f"Any hotel in {city}."
        examples.append(Example(query, (Step("hotel", json.dumps({"name": "hotel", "arguments": arguments})),)))
    return examples


def test_each_calls_keys_are_read_off_its_labels_in_the_routing_states_order(lively_backbone):
    model = hotel_model(lively_backbone)
    examples = training_examples()
    encoded = encode_examples(model, examples, TrainConfig())
    found = routing_states(model, encoded, progress=False)
    keys = call_key_sets(encoded, model.vocab_size, lively_backbone.eos_token_id, lively_backbone.tokenizer)
    assert len(keys) == len(found.rows) == len(examples)
    assert keys == [frozenset(json.loads(e.steps[0].response)["arguments"]) for e in examples]


def test_training_with_key_sets_fits_a_row_per_key_set_that_chooses_the_training_calls(lively_backbone):
    model = hotel_model(lively_backbone)
    report = tokmem.train(
        model, training_examples(), TrainConfig(epochs=1, batch_size=4, key_sets=True, progress=False)
    )
    assert model.bank.key_sets[0].keys == [PLAIN, STARRED]
    assert report.key_sets == {
        "tools": 1,
        "key_sets": 2,
        "calls": 8,
        "chosen_right": 8,
        "iterations_at_most": FIT_ITERATIONS,
    }
    assert model.bank.parameter_count() == lively_backbone.hidden_size + 2 * (lively_backbone.hidden_size + 1)
    model.bank.freeze()
    assert model.bank.parameter_count(trainable_only=True) == 0  # a frozen tool's key-set rows are not this round's


def test_a_tool_whose_calls_write_one_key_set_gets_no_key_set_rows(lively_backbone):
    model = hotel_model(lively_backbone)
    plain = [e for e in training_examples() if "stars" not in e.steps[0].response]
    report = tokmem.train(model, plain, TrainConfig(epochs=1, batch_size=4, key_sets=True, progress=False))
    assert model.bank.key_sets == [None] and report.key_sets["tools"] == 0


def test_the_regression_learns_a_linear_rule_that_holds_on_new_states():
    generator = torch.Generator().manual_seed(0)
    direction = torch.randn(16, generator=generator)
    train, new = (torch.randn(n, 16, generator=generator) * 3 + 1 for n in (60, 200))
    weight, bias = logistic_regression(train, (train @ direction > 0).long(), 2)
    right = ((new @ weight.T + bias).argmax(1) == (new @ direction > 0).long()).float().mean()
    assert right >= 0.9 and weight.dtype == torch.float32


def test_key_set_rows_survive_saving_loading_merging_and_removing(lively_backbone, tmp_path):
    model = with_key_sets(hotel_model(lively_backbone), torch.randn(2, lively_backbone.hidden_size), [0.5, -0.5])
    model.bank.add(["chat"], lively_backbone.mean_embedding())
    loaded = tokmem.MemoryBank.load(model.bank.save(tmp_path / "b.safetensors"), backbone=lively_backbone)
    assert loaded.metadata()["format_version"] == 5 and loaded.key_sets[1] is None
    assert loaded.key_sets[0].keys == [PLAIN, STARRED]
    assert torch.equal(loaded.key_sets[0].weight, model.bank.key_sets[0].weight)
    assert loaded.key_sets[0].bias.tolist() == [0.5, -0.5]
    other = tokmem.create(lively_backbone).bank
    other.add(["x"], lively_backbone.mean_embedding())
    other.merge(loaded)
    other.remove("x")
    assert other.key_sets[0].keys == [PLAIN, STARRED] and other.key_sets[1] is None


def test_a_bank_file_with_bad_key_sets_is_refused_by_field(lively_backbone, tmp_path):
    model = with_key_sets(hotel_model(lively_backbone), torch.zeros(2, lively_backbone.hidden_size), [0.0, 1.0])
    path = model.bank.save(tmp_path / "b.safetensors")
    meta_file = path.with_name(path.name + ".json")
    meta = json.loads(meta_file.read_text())
    meta["key_sets"] = [[["city"], ["city"]]]
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(BankError, match=r"b.safetensors.json: field 'key_sets'\[0\]: a key set is listed twice"):
        tokmem.MemoryBank.load(path)


@pytest.mark.parametrize("bias", [[0.0, 5.0], [5.0, 0.0]])
def test_served_calls_follow_the_key_set_rows_as_tokmem_chat_does(lively_backbone, tmp_path, bias):
    model = with_key_sets(hotel_model(lively_backbone), torch.zeros(2, lively_backbone.hidden_size), bias)
    model.bank.save(tmp_path / "banks" / "hotels.safetensors")
    app, engine = serve(lively_backbone, tmp_path / "banks", max_new_tokens=40)

    async def scenario(client, http):
        return await client.chat.completions.create(
            model="hotels", messages=ASK, tool_choice="required", extra_body={"bank_tools": True}
        )

    engine.start()
    try:
        response = call(app, scenario)
    finally:
        engine.stop()
    served = json.loads(response.choices[0].message.tool_calls[0].function.arguments)
    offline = tokmem.chat(model, ASK, tool_choice="required", config=CONFIG).tool_calls[0].arguments
    assert served == json.loads(offline) and set(served) == set(STARRED if bias[1] else PLAIN)


def test_bank_show_lists_each_tools_key_sets(lively_backbone, tmp_path, capsys):
    from tokmem.cli import main

    model = with_key_sets(hotel_model(lively_backbone), torch.zeros(2, lively_backbone.hidden_size), [0.0, 1.0])
    path = model.bank.save(tmp_path / "b.safetensors")
    assert main(["bank", "show", str(path)]) == 0
    assert "hotel key sets (chosen where it is routed): city; city, stars" in capsys.readouterr().out
