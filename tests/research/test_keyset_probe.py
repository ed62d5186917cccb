"""The key-set probe (research/scripts/keyset_probe.py): fitted per tool on states, against the habit and decoded answers."""

import json

import torch
from research.scripts import keyset_probe

import tokmem
from tokmem import Example, Step
from tokmem.data.procedures import call_json
from tokmem.training.train import TrainConfig, encode_examples


SORTED, PLAIN = frozenset({"id", "sortBy"}), frozenset({"id"})


def test_the_probe_reads_a_key_set_a_direction_of_the_state_carries_where_the_habit_cannot():
    torch.manual_seed(0)
    sorts = torch.tensor([1, 1, 1, 0, 1, 1, 0, 1, 1, 1])  # the habit: sortBy on most training calls
    states = torch.randn(10, 8) + 4 * sorts[:, None] * torch.eye(8)[0]
    train = [("Search", SORTED if s else PLAIN) for s in sorts.tolist()] + [("Rent", PLAIN)] * 2
    states = torch.cat([states, torch.randn(2, 8)])
    test = [("Search", PLAIN), ("Search", SORTED), ("Rent", PLAIN), ("Search", PLAIN)]
    test_states = torch.stack([-4 * torch.eye(8)[0], 4 * torch.eye(8)[0], torch.zeros(8), -4 * torch.eye(8)[0]])
    probed = keyset_probe.KeySetProbe(states, train).predict_all(test_states, test)
    assert probed == [PLAIN, SORTED, PLAIN, PLAIN]  # "Rent" has one training key set: that one
    assert keyset_probe.habit(train, test) == [SORTED, SORTED, PLAIN, SORTED]
    assert keyset_probe.right(probed, test, [True] * 4) == "4 of 4"
    assert keyset_probe.right(keyset_probe.habit(train, test), test, [True, True, True, False]) == "2 of 3"


def test_a_decoded_key_set_counts_only_where_the_call_named_the_right_tool(tmp_path):
    example = Example("q", (Step("Search", call_json("Search", {"id": 1})), Step("Rent", call_json("Rent", {"id": 2}))))
    samples = [
        {
            "query": "q",
            "gold": [s.response for s in example.steps],
            "step": [call_json("Search", {"id": 1, "sortBy": "x"}), call_json("Search", {"id": 2})],
        }
    ]
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"methods": {"lora": {"samples": samples}}}))
    assert keyset_probe.decoded_key_sets(f"{path}:lora", [example]) == [SORTED, None]


def test_the_states_are_read_at_each_call_before_and_at_its_memory_token(backbone):
    model = tokmem.create(backbone)
    model.bank.add(["Search", "Rent"], backbone.mean_embedding(), kinds=["tool", "tool"])
    examples = [
        Example("a", (Step("Search", call_json("Search", {"id": 1})), Step("Rent", call_json("Rent", {"id": 2})))),
        Example("b", (Step("Rent", call_json("Rent", {"id": 3})),)),
    ]
    encoded = encode_examples(model, examples, TrainConfig(max_length=256))
    states = keyset_probe.call_states(model, encoded, batch_size=2)
    assert keyset_probe.gold_calls(examples) == [("Search", PLAIN), ("Rent", PLAIN), ("Rent", PLAIN)]
    assert states["before"].shape == states["at"].shape == (3, backbone.model.config.hidden_size)
    alone = keyset_probe.call_states(model, encoded[1:], batch_size=1)  # padding in a batch changes nothing
    assert torch.allclose(alone["at"], states["at"][2:], atol=1e-5)
    assert not torch.allclose(states["before"], states["at"])


def test_each_step_decodes_exactly_the_key_set_the_probe_reads_off_its_state(lively_backbone):
    schema = {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "sortBy": {"type": "string", "enum": ["price"]}},
        "required": ["id"],
    }
    model = tokmem.create(lively_backbone)
    model.bank.add(["Search"], lively_backbone.mean_embedding(), kinds=["tool"], schemas=[schema])
    sorted_state, plain_state = torch.eye(4)[0] * 3, -torch.eye(4)[0] * 3
    fitted = keyset_probe.KeySetProbe(
        torch.stack([sorted_state, plain_state] * 3), [("Search", SORTED), ("Search", PLAIN)] * 3
    )
    examples = [Example(q, (Step("Search", call_json("Search", {"id": 1})),)) for q in ("find one", "find two")]
    answer = keyset_probe.probe_answerer(
        model,
        tokmem.DecodeConfig(max_new_tokens=96, threshold=0.0),
        fitted,
        torch.stack([sorted_state, plain_state]),
        examples,
    )
    calls, read = answer(examples, [[], []], [tokmem.ChatCache(), tokmem.ChatCache()], "required")
    assert [tool for _, tool in calls] == ["Search", "Search"] and read > 0
    assert [frozenset(json.loads(call)["arguments"]) for call, _ in calls] == [SORTED, PLAIN]
