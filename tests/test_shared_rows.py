"""A bank with shared rows (``shared_tokens``): input rows every tool reads after its own memory tokens, laid out in
training, in a conversation's history and in decoding as a tool's tail is; trained with every tool's calls in the
bank's first round and frozen after, so adding tools does not change how the old ones are steered."""

import json

import pytest
import torch
from helpers import city_count_chain, city_count_model, edited_bank_file, example_messages

import tokmem
from tokmem import ChatCache, DecodeConfig, Example, Step
from tokmem.bank.memory_bank import MemoryBank
from tokmem.decoding.conversation import conversation_ids
from tokmem.errors import BankError
from tokmem.training.sequences import IGNORE, collate, encode
from tokmem.training.loss import batch_loss

CONFIG = DecodeConfig(max_new_tokens=40, references=False)
CHAIN = city_count_chain()
QUERY = example_messages(CHAIN)[:1]


@pytest.fixture
def shared(lively_backbone):
    return city_count_model(lively_backbone, memory_tokens=2, shared_tokens=1)


def encoded(model, example=CHAIN):
    return encode(
        example,
        model.backbone.tokenizer,
        model.memory_id,
        1024,
        tools=model.bank.tool_schemas(),
        tail_ids=model.tail_ids,
    )


def test_each_call_lays_out_its_memory_token_its_tail_then_the_same_shared_rows_before_its_arguments(shared):
    city, count = shared.memory_id("city"), shared.memory_id("count")
    shared_id = shared.vocab_size + len(shared.bank) * 2  # after the rows and the tails
    assert shared.tail_ids(city) == [shared.vocab_size + 2, shared_id]
    assert shared.tail_ids(count) == [shared.vocab_size + 3, shared_id]
    laid_out = encoded(shared)
    start = laid_out.input_ids.index(city)
    arguments = shared.backbone.tokenizer('{"city":"Rome"}', add_special_tokens=False)["input_ids"]
    assert laid_out.input_ids[start : start + 3 + len(arguments)] == [city, *shared.tail_ids(city), *arguments]
    assert laid_out.labels[start : start + 3] == [city, IGNORE, IGNORE]  # read, never written
    assert torch.equal(shared.memory_matrices()[1][shared_id - shared.vocab_size], shared.bank.shared[0])


def test_the_shared_rows_steer_the_arguments_and_train_with_the_first_round_only(shared, lively_backbone):
    batch = collate([encoded(shared)], shared.backbone.tokenizer.pad_token_id)
    before = float(batch_loss(shared, batch)[0])
    rows = shared.bank.shared.clone()
    shared.bank.shared = -rows
    assert float(batch_loss(shared, batch)[0]) != pytest.approx(before)
    shared.bank.shared = rows
    report = tokmem.train(shared, [CHAIN] * 4, tokmem.TrainConfig(epochs=4, batch_size=2, lr=5e-2))
    assert report.losses[-1] < report.losses[0]
    assert not torch.equal(shared.bank.shared, rows)
    assert not any(p.requires_grad for p in shared.backbone.model.parameters())

    first_round = shared.bank.shared.clone()
    weather = Example("Weather in Oslo?", (Step("weather", '{"name":"weather","arguments":{"city":"Oslo"}}'),))
    report = tokmem.learn(shared, [weather] * 2, tokmem.TrainConfig(epochs=2, batch_size=2, lr=5e-2))
    assert report.new_procedures == ["weather"] and report.losses[-1] < report.losses[0]
    assert torch.equal(shared.bank.shared, first_round)  # a later round reads them as they are


def test_the_shared_rows_count_once_as_parameters_and_train_only_while_every_row_does(shared, lively_backbone):
    width = shared.bank.hidden_size
    assert shared.bank.shared_trainable and shared.bank.parameter_count(trainable_only=True) == (2 * 2 + 1) * width
    shared.bank.freeze()
    shared.bank.add(["weather"], lively_backbone.mean_embedding(), kinds=["tool"])
    assert not shared.bank.shared_trainable
    assert shared.bank.parameter_count(trainable_only=True) == 2 * width  # the new row and its tail
    assert shared.bank.parameter_count() == (3 * 2 + 1) * width


def test_a_conversation_is_laid_out_as_training_lays_out_the_chain_and_chat_keeps_the_shared_rows_in_its_cache(shared):
    assert conversation_ids(shared, example_messages(CHAIN)) == encoded(shared).input_ids[:-1]
    cache = ChatCache()
    reply = tokmem.chat(shared, QUERY, tool_choice="required", config=CONFIG, cache=cache)
    memory = shared.memory_id(reply.tool_calls[0].name)
    start = cache.ids.index(memory)
    assert cache.ids[start + 1 : start + 3] == shared.tail_ids(memory)


def test_the_bank_file_keeps_the_shared_rows_in_a_version_older_readers_refuse(shared, tmp_path):
    path = shared.bank.save(tmp_path / "shared.safetensors")
    loaded = MemoryBank.load(path)
    assert loaded.shared_tokens == 1 and torch.equal(loaded.shared, shared.bank.shared)
    meta = json.loads(path.with_suffix(".safetensors.json").read_text())
    assert meta["shared_tokens"] == 1 and meta["format_version"] == 4
    assert loaded.parameter_count() == (2 * 2 + 1) * loaded.hidden_size
    assert not loaded.shared_trainable  # a loaded bank's rows are frozen: so are its shared rows


def test_a_bank_with_shared_rows_refuses_text_procedures_and_merging(shared):
    with pytest.raises(BankError, match="holds tools only; 'chat' is a text procedure"):
        shared.bank.add(["chat"], shared.backbone.mean_embedding())
    other = MemoryBank(shared.bank.hidden_size, backbone=shared.bank.backbone, memory_tokens=2, shared_tokens=1)
    with pytest.raises(BankError, match="cannot merge banks with shared rows"):
        shared.bank.merge(other)
    with pytest.raises(BankError, match="cannot merge banks with shared rows"):
        tokmem.compose([shared, tokmem.create(shared.backbone)])
    with pytest.raises(BankError, match="shared_tokens must be from 0 to 64"):
        MemoryBank(8, shared_tokens=-1)


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda meta, tensors: meta.update(shared_tokens=True), "field 'shared_tokens' must be a whole number from 0"),
        (
            lambda meta, tensors: meta.update(shared_tokens=2),
            r"tensor 'shared' has shape \(1, \d+\), the metadata says",
        ),
        (lambda meta, tensors: tensors.pop("shared"), "tensor 'shared' is missing"),
        (
            lambda meta, tensors: tensors["shared"].fill_(float("nan")),
            r"tensor 'shared' has NaN/Inf values in rows \[0\]$",
        ),
    ],
)
def test_a_bank_file_whose_shared_rows_disagree_with_its_metadata_is_refused_naming_the_field(
    shared, tmp_path, change, error
):
    with pytest.raises(BankError, match=error):
        MemoryBank.load(edited_bank_file(shared.bank, tmp_path / "shared.safetensors", change))
