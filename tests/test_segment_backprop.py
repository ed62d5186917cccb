"""``TrainConfig.segment_backprop``: in a tool loop each labelled segment back-propagates on its own, attending to the
record's states before it computed without gradients; exact with one segment a record, off by default."""

import copy

import pytest
import torch
from helpers import random_rows

import tokmem
from tokmem import Example, Step, TrainConfig
from tokmem.backbones import Backbone
from tokmem.data.procedures import call_json
from tokmem.training.loss import batch_loss, next_token_loss
from tokmem.training.sequences import IGNORE, collate, encode


def random_model(backbone, names: list[str], kinds: list[str], decoupled: bool = False):
    """A model whose rows ``names`` have random values (for DC, steer apart from index)."""
    model = tokmem.create(backbone, decoupled=decoupled)
    model.bank.add(names, backbone.mean_embedding(), kinds=kinds)
    random_rows(model.bank, scale=0.5)
    return model


@pytest.fixture(scope="module")
def eager_backbone(lively_backbone):
    """The lively backbone with the eager attention implementation (an additive mask, not SDPA's boolean one)."""
    model = copy.deepcopy(lively_backbone.model)
    model.config._attn_implementation = "eager"
    return Backbone("tiny-random-x20-eager", model, lively_backbone.tokenizer)


DECOUPLED = pytest.mark.parametrize("decoupled", [False, True], ids=["coupled", "decoupled"])


def tool_loops() -> list[Example]:
    """Records of several segments with results between them: one ends with a result (its last label is ANSWER),
    one with an answer in words; unequal lengths, so the batch is padded."""
    find = lambda query, result: Step("Find", call_json("Find", {"query": query}), result)  # noqa: E731
    rent = lambda lat, result: Step("Rent", call_json("Rent", {"lat": lat}), result)  # noqa: E731
    return [
        Example("Rent a car at the Marriott.", (find("Marriott", '{"lat":32.87}'), rent(32.87, '{"cars":3}'))),
        Example("Where is the car?", (rent(1.5, "none left"), find("car park", '{"lat":1}')), answer="At 1."),
    ]


def batch_of(model, examples):
    tokenizer = model.backbone.tokenizer
    tools = model.bank.tool_schemas()
    return collate([encode(e, tokenizer, model.memory_id, 1024, None, tools) for e in examples], tokenizer.pad_token_id)


def segments(labels: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of labelled positions."""
    runs, start = [], None
    for t, label in enumerate([*labels, IGNORE]):
        if label != IGNORE and start is None:
            start = t
        if label == IGNORE and start is not None:
            runs.append((start, t))
            start = None
    return runs


def records(batch) -> list[tuple[list[int], list[int]]]:
    """Each record of the batch alone: its ids and labels without the padding."""
    lengths = batch["attention_mask"].sum(-1).tolist()
    return [
        (ids[:n], labels[:n]) for ids, labels, n in zip(batch["input_ids"].tolist(), batch["labels"].tolist(), lengths)
    ]


def segment_loss_sums(model, input_ids: list[int], labels: list[int]) -> list[tuple[int, torch.Tensor]]:
    """For one record alone: (first token, summed loss) of each segment, the reference the option must match,
    built through the backbone's own cache: the record up to the segment without gradients, then the segment on
    top of that cache with gradients."""
    index, steer = model.memory_matrices()
    base = model.lm.base_model
    sums = []
    for start, end in segments(labels):
        with torch.no_grad():
            context = base(inputs_embeds=model.embed(torch.tensor([input_ids[:start]]), steer), use_cache=True)
        states = [context.last_hidden_state[0, -1:]]
        if end - start > 1:
            own = model.embed(torch.tensor([input_ids[start : end - 1]]), steer)
            states.append(base(inputs_embeds=own, past_key_values=context.past_key_values).last_hidden_state[0])
        logits = model.logits(torch.cat(states), index).float()
        loss = next_token_loss(logits, torch.tensor(labels[start:end]), model.vocab_size) * (end - start)
        sums.append((input_ids[start], loss))
    return sums


@DECOUPLED
def test_with_one_segment_a_record_the_loss_and_row_gradients_are_full_back_propagations(
    lively_backbone, examples, decoupled
):
    model = random_model(lively_backbone, ["reverse", "upper"], ["text", "text"], decoupled)
    batch = batch_of(model, examples)  # atomic records and a chain written without results: one run of labels each
    assert all(len(segments(row)) == 1 for row in batch["labels"].tolist())
    rows = model.unfreeze_rows()
    full, count = batch_loss(model, batch)
    segmented, segmented_count = batch_loss(model, batch, segments=True)
    assert segmented_count == count
    assert segmented.item() == pytest.approx(full.item(), rel=1e-6)
    for a, b in zip(torch.autograd.grad(segmented, rows), torch.autograd.grad(full, rows)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@DECOUPLED
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_with_several_segments_the_gradients_are_each_segments_own_loss_with_the_context_detached(
    request, decoupled, attention
):
    backbone = request.getfixturevalue("lively_backbone" if attention == "sdpa" else "eager_backbone")
    model = random_model(backbone, ["Find", "Rent"], ["tool", "tool"], decoupled)
    one_call = Example("Find the Hilton.", (Step("Find", call_json("Find", {"query": "Hilton"})),))
    batch = batch_of(model, [*tool_loops(), one_call])
    assert [len(segments(labels)) for _, labels in records(batch)] == [3, 3, 1]  # two calls and the answer; one
    rows = model.unfreeze_rows()
    segmented, count = batch_loss(model, batch, segments=True)
    reference = [loss for ids, labels in records(batch) for _, loss in segment_loss_sums(model, ids, labels)]
    reference = torch.stack(reference).sum() / count
    assert segmented.item() == pytest.approx(reference.item(), rel=1e-5)
    for a, b in zip(torch.autograd.grad(segmented, rows), torch.autograd.grad(reference, rows)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_a_rows_input_side_learns_from_its_own_segments_loss_only_unlike_full_back_propagation(lively_backbone):
    model = random_model(lively_backbone, ["Find", "Rent"], ["tool", "tool"], decoupled=True)  # steer apart
    batch = batch_of(model, tool_loops())
    find = model.memory_id("Find")
    model.unfreeze_rows()
    steer = model.row_steer
    segmented, count = batch_loss(model, batch, segments=True)
    sums = [pair for ids, labels in records(batch) for pair in segment_loss_sums(model, ids, labels)]
    own = [loss for first, loss in sums if first == find]
    assert len(own) == 2  # Find's call in each record
    (own_grad,) = torch.autograd.grad(torch.stack(own).sum() / count, steer)
    (segmented_grad,) = torch.autograd.grad(segmented, steer)
    (full_grad,) = torch.autograd.grad(batch_loss(model, batch)[0], steer)
    row = model.bank.row("Find")
    torch.testing.assert_close(segmented_grad[row], own_grad[row], rtol=1e-4, atol=1e-6)
    assert not torch.allclose(full_grad[row], own_grad[row], rtol=1e-2, atol=1e-4)  # later segments read it there


def test_training_with_the_option_off_is_todays_training_bit_for_bit_and_on_it_moves_the_rows_otherwise(
    lively_backbone,
):
    assert TrainConfig().segment_backprop is False
    trained = {}
    for name, config in {
        "default": TrainConfig(epochs=2, batch_size=2, lr=0.05, progress=False),
        "off": TrainConfig(epochs=2, batch_size=2, lr=0.05, progress=False, segment_backprop=False),
        "on": TrainConfig(epochs=2, batch_size=2, lr=0.05, progress=False, segment_backprop=True),
    }.items():
        model = tokmem.create(lively_backbone)
        tokmem.learn(model, tool_loops(), config, schemas={"Find": None, "Rent": None})
        trained[name] = model.bank.index
    assert torch.equal(trained["off"], trained["default"])
    assert not torch.allclose(trained["on"], trained["off"], rtol=1e-3, atol=1e-5)


def test_learning_atomic_records_with_the_option_gives_the_rows_of_full_back_propagation(backbone, examples):
    trained = []
    for segment_backprop in (False, True):
        model = tokmem.create(backbone)
        config = TrainConfig(epochs=3, lr=0.05, progress=False, segment_backprop=segment_backprop)
        tokmem.learn(model, examples, config)
        trained.append(model.bank.index)
    torch.testing.assert_close(trained[1], trained[0], rtol=1e-4, atol=1e-6)
