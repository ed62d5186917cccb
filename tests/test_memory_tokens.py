"""A bank of several memory tokens a tool (``memory_tokens`` k > 1): the first routes, the tool's tail (k - 1 input rows)
follows it as context before the arguments — in training, in a conversation's history and in decoding
(every decoder: ``tokmem.bank.memory_ids``)."""

import json

import pytest
import torch
from helpers import city_count_chain, city_count_model, edited_bank_file, example_messages

import tokmem
from tokmem import ChatCache, DecodeConfig
from tokmem.bank.memory_bank import MemoryBank
from tokmem.decoding.conversation import conversation_ids
from tokmem.errors import BankError
from tokmem.training.sequences import IGNORE, collate, encode
from tokmem.training.loss import batch_loss

CONFIG = DecodeConfig(max_new_tokens=40, references=False)
CHAIN = city_count_chain()
QUERY = example_messages(CHAIN)[:1]


def tool_model(backbone, memory_tokens: int = 3):
    return city_count_model(backbone, memory_tokens=memory_tokens)


@pytest.fixture
def tails(lively_backbone):
    return tool_model(lively_backbone)


def encoded(model):
    return encode(
        CHAIN, model.backbone.tokenizer, model.memory_id, 1024, tools=model.bank.tool_schemas(), tail_ids=model.tail_ids
    )


def test_training_lays_out_each_call_as_memory_token_tail_then_arguments_the_tail_not_a_target(tails):
    laid_out = encoded(tails)
    memory = tails.memory_id("city")
    start = laid_out.input_ids.index(memory)
    tail = tails.tail_ids(memory)
    arguments = tails.backbone.tokenizer('{"city":"Rome"}', add_special_tokens=False)["input_ids"]
    assert len(tail) == 2 and min(tail) >= tails.vocab_size + len(tails.bank)  # after every row: never routed to
    assert laid_out.input_ids[start : start + 3 + len(arguments)] == [memory, *tail, *arguments]
    assert laid_out.labels[start : start + 3 + len(arguments)] == [memory, IGNORE, IGNORE, *arguments]
    assert tails.tail_ids(tails.memory_id("count"))[0] == tail[-1] + 1  # each tool's tail its own


def test_the_tail_is_read_by_the_arguments_and_trains_with_the_rows_alone(tails):
    batch = collate([encoded(tails)], tails.backbone.tokenizer.pad_token_id)
    before = float(batch_loss(tails, batch)[0])
    tails.bank.tail = tails.bank.tail.flip(0)  # each tool given the other's tail
    assert float(batch_loss(tails, batch)[0]) != pytest.approx(before)
    tail = tails.bank.tail.clone()
    report = tokmem.train(tails, [CHAIN] * 4, tokmem.TrainConfig(epochs=6, batch_size=2, lr=5e-2))
    assert report.losses[-1] < report.losses[0]
    assert not torch.equal(tails.bank.tail, tail)
    assert not any(p.requires_grad for p in tails.backbone.model.parameters())


def test_a_conversation_is_laid_out_as_training_lays_out_the_chain_with_the_tails(tails):
    messages = example_messages(CHAIN)
    assert conversation_ids(tails, messages) == encoded(tails).input_ids[:-1]


def test_chat_routes_as_the_first_rows_alone_and_the_cache_holds_the_tail_before_the_arguments(lively_backbone):
    one, tails = tool_model(lively_backbone, 1), tool_model(lively_backbone, 3)
    assert torch.equal(one.bank.index, tails.bank.index)
    for tool_choice in ("required", "auto"):
        without = tokmem.chat(one, QUERY, tool_choice=tool_choice, config=CONFIG)
        with_tails = tokmem.chat(tails, QUERY, tool_choice=tool_choice, config=CONFIG)
        first = lambda reply: [c.name for c in reply.tool_calls][:1]  # noqa: E731
        assert first(with_tails) == first(without)  # the first token routes alone
    cache = ChatCache()
    reply = tokmem.chat(tails, QUERY, tool_choice="required", config=CONFIG, cache=cache)
    memory = tails.memory_id(reply.tool_calls[0].name)
    assert cache.ids[cache.ids.index(memory) + 1 : cache.ids.index(memory) + 3] == tails.tail_ids(memory)
    conversations = [QUERY, [{"role": "user", "content": "Count the apples in Oslo, please."}]]
    together = tokmem.chat_batch(tails, conversations, tool_choice="required", config=CONFIG)
    assert together == [tokmem.chat(tails, c, tool_choice="required", config=CONFIG) for c in conversations]


def test_the_bank_file_keeps_the_tails_and_counts_them_as_parameters(tails, tmp_path):
    path = tails.bank.save(tmp_path / "tails.safetensors")
    loaded = MemoryBank.load(path)
    assert loaded.memory_tokens == 3 and torch.equal(loaded.tail, tails.bank.tail)
    meta = json.loads(path.with_suffix(".safetensors.json").read_text())
    assert meta["memory_tokens"] == 3 and meta["format_version"] == 3  # a tokmem reading version 2 at most refuses it
    assert loaded.parameter_count() == 2 * 3 * loaded.hidden_size
    loaded.remove("city")
    assert torch.equal(loaded.tail, tails.bank.tail[1:])


def test_a_bank_of_several_memory_tokens_refuses_text_procedures_and_other_forms(tails):
    with pytest.raises(BankError, match="holds tools only; 'chat' is a text procedure"):
        tails.bank.add(["chat"], tails.backbone.mean_embedding())
    with pytest.raises(BankError, match="cannot merge a bank of 1 memory tokens a procedure into one of 3"):
        tails.bank.merge(MemoryBank(tails.bank.hidden_size, backbone=tails.bank.backbone))
    with pytest.raises(BankError, match="memory_tokens must be from 1 to 64"):
        MemoryBank(8, memory_tokens=0)


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda meta, tensors: meta.update(memory_tokens="2"), "field 'memory_tokens' must be a whole number from 1"),
        (
            lambda meta, tensors: meta.update(memory_tokens=2),
            r"tensor 'tail' has shape \(2, 2, \d+\), the metadata says",
        ),
        (lambda meta, tensors: tensors.pop("tail"), "tensor 'tail' is missing"),
    ],
)
def test_a_bank_file_whose_tails_disagree_with_its_metadata_is_refused_naming_the_field(tails, tmp_path, change, error):
    with pytest.raises(BankError, match=error):
        MemoryBank.load(edited_bank_file(tails.bank, tmp_path / "tails.safetensors", change))
