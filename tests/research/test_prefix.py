"""Prefix tuning: trainable rows before the chat-formatted query, a frozen backbone, TokMem's parameter budget."""

import pytest
import torch

from helpers import random_rows
from tokmem import DecodeConfig, TrainConfig
from research.methods import prefix
from research.studies.placement import build
from tokmem.training.sequences import IGNORE, chat_prefix, collate
from tokmem.training.loss import batch_loss


def test_only_the_prefix_rows_get_gradients(lively_backbone, examples):
    model = prefix.create(lively_backbone, tokens=2)
    tokenizer = lively_backbone.tokenizer
    params = model.unfreeze_rows()
    batch = collate(
        [prefix.encode(model, e.query, prefix.response_ids(tokenizer, e.response)) for e in examples],
        tokenizer.pad_token_id,
    )
    loss, _ = batch_loss(model, batch)
    loss.backward()
    assert [p.shape for p in params] == [(2, lively_backbone.hidden_size)]
    assert all(p.grad is None for p in lively_backbone.model.parameters())
    assert (params[0].grad.abs().sum(dim=1) > 0).all()  # each of the two rows


def test_prefix_training_leaves_the_backbone_bit_identical_and_moves_the_rows(backbone, examples):
    before = {k: v.clone() for k, v in backbone.model.state_dict().items()}
    model = prefix.create(backbone, tokens=2)
    prefix.train(model, examples, TrainConfig(epochs=2, lr=0.1, progress=False))
    after = backbone.model.state_dict()
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert not torch.equal(model.bank.index[0], backbone.mean_embedding())


def test_prefix_training_lowers_the_loss_of_one_procedure(lively_backbone, examples):
    model = prefix.create(lively_backbone, tokens=1)
    reverse = [e for e in examples if e.procedures == ["reverse"]]
    losses = prefix.train(model, reverse, TrainConfig(epochs=30, batch_size=4, lr=2e-2, progress=False)).losses
    assert sum(losses[-5:]) < 0.85 * sum(losses[:5])


def test_new_prefix_rows_start_as_the_mean_input_embedding(backbone):
    model = prefix.create(backbone, tokens=3)
    assert model.bank.names == ["prefix#0", "prefix#1", "prefix#2"]
    assert all(torch.equal(row, backbone.mean_embedding()) for row in model.bank.index)


def test_the_training_sequence_is_prefix_then_chat_query_then_target_with_only_the_target_labelled(backbone):
    model = prefix.create(backbone, tokens=2)
    query = chat_prefix(backbone.tokenizer, "Reverse sun.")
    encoded = prefix.encode(model, "Reverse sun.", [5, 6, 7])
    memory = [backbone.vocab_size, backbone.vocab_size + 1]
    assert encoded.input_ids == memory + query + [5, 6, 7]
    assert encoded.labels == [IGNORE] * (2 + len(query)) + [5, 6, 7]


def test_generation_feeds_the_prefix_rows_before_the_chat_formatted_query(backbone):
    model = prefix.create(backbone, tokens=2)
    random_rows(model.bank)
    queries = ["Reverse sun.", "Write blueberry in capitals."]  # unequal lengths: the first is left-padded
    seen = []
    hook = model.lm.base_model.register_forward_pre_hook(
        lambda _, args, kwargs: seen.append(kwargs["inputs_embeds"]), with_kwargs=True
    )
    try:
        prefix.generate(model, queries, DecodeConfig(max_new_tokens=1))
    finally:
        hook.remove()
    words = backbone.model.get_input_embeddings()
    for row, query in zip(seen[0], queries):
        ids = chat_prefix(backbone.tokenizer, query)
        expected = torch.cat([model.bank.index, words(torch.tensor(ids))])
        assert torch.equal(row[-len(expected) :], expected)


def test_generation_equals_step_by_step_greedy_decoding_of_each_query_alone(lively_backbone):
    model = prefix.create(lively_backbone, tokens=2)
    random_rows(model.bank, scale=0.5)
    queries = ["Reverse sun.", "Write blueberry in capitals."]
    answers = prefix.generate(model, queries, DecodeConfig(max_new_tokens=6))
    assert answers == [_greedy(model, q, 6) for q in queries]


def _greedy(model, query, steps):
    ids = model.prefix_ids() + chat_prefix(model.backbone.tokenizer, query)
    new = []
    for _ in range(steps):
        batch = torch.tensor([ids + new])
        hidden, _ = model.hidden(batch, torch.ones_like(batch))
        token = int(model.logits(hidden[0, -1]).argmax())
        if token == model.backbone.eos_token_id:
            break
        new.append(token)
    return model.backbone.tokenizer.decode(new, skip_special_tokens=True).strip()


def test_prefix_rows_are_never_output_classes(backbone):
    model = prefix.create(backbone, tokens=5)
    hidden = torch.randn(3, backbone.hidden_size)
    assert model.logits(hidden).shape == (3, backbone.vocab_size)


@pytest.mark.parametrize("tokens", [1, 2, 5])
def test_prefix_trains_as_many_parameters_as_tokmem_with_as_many_tokens(backbone, tokens):
    counts = [
        sum(p.numel() for p in build(method, tokens, backbone).unfreeze_rows()) for method in ("prefix", "tokmem")
    ]
    assert counts == [tokens * backbone.hidden_size] * 2
