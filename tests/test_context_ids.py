"""The context ids that follow a memory token (a tool's tail, the shared rows; ``tokmem.bank.memory_ids``): one rule,
fed after each memory token by every decoder, so ``generate`` chains calls of such a bank as ``tokmem.chat`` answers."""

import pytest
import torch
from helpers import city_count_chain, city_count_model, example_messages

import tokmem
from tokmem import DecodeConfig
from tokmem.bank.memory_ids import ContextLayout
from tokmem.data.procedures import assemble_call
from tokmem.errors import BankError

CONFIG = DecodeConfig(max_new_tokens=40, references=False, threshold=0.0)
FORMS = [{"memory_tokens": 3}, {"memory_tokens": 2, "shared_tokens": 1}, {"shared_tokens": 2}]


def forced_chain(layout: ContextLayout, first: int, vocab: int) -> list[int]:
    """The ids ``layout`` forces after ``first``, one after another, until none."""
    chain, last = [], torch.tensor([first])
    while (following := layout.after(last, vocab)).item() >= 0:
        chain.append(following.item())
        last = following
    return chain


@pytest.mark.parametrize("form", FORMS)
def test_after_each_memory_token_the_forced_ids_are_its_tail_then_the_shared_rows(lively_backbone, form):
    model = city_count_model(lively_backbone, **form)
    vocab, layout = model.vocab_size, ContextLayout.of([model.bank], "cpu")
    for name in ("city", "count"):
        memory = model.memory_id(name)
        assert forced_chain(layout, memory, vocab) == model.tail_ids(memory) != []
        assert layout.routes(torch.tensor([memory, *model.tail_ids(memory), vocab - 1]), vocab).tolist() == [
            True,
            *[False] * len(model.tail_ids(memory)),
            False,
        ]
    assert forced_chain(layout, vocab - 1, vocab) == []  # after a word: nothing forced


def test_each_row_of_a_batch_follows_its_own_banks_layout(lively_backbone):
    tails, shared = (city_count_model(lively_backbone, **form) for form in FORMS[:2])
    layout = ContextLayout.of([tails.bank, shared.bank], "cpu")
    vocab = tails.vocab_size
    last = torch.tensor([tails.memory_id("count"), shared.memory_id("count")])
    assert layout.after(last, vocab).tolist() == [tails.tail_ids(last[0].item())[0], shared.tail_ids(last[1].item())[0]]
    assert ContextLayout.of([city_count_model(lively_backbone).bank], "cpu") is None  # one memory token, no shared rows


@pytest.mark.parametrize("form", FORMS)
def test_generate_chains_the_calls_of_a_bank_with_context_rows_as_chat_answers(lively_backbone, form):
    model = city_count_model(lively_backbone, **form)
    query = example_messages(city_count_chain())[:1]
    generated = tokmem.generate(model, [query[0]["content"]], CONFIG)[0]
    chat = tokmem.chat(model, query, tool_choice="required", config=CONFIG)
    assert [s.text for s in generated.trace] == [assemble_call(c.name, c.arguments) for c in chat.tool_calls]
    assert len(chat.tool_calls) >= 1 and all(s.procedure in ("city", "count") for s in generated.trace)


@pytest.mark.parametrize("form", FORMS)
def test_a_call_after_forced_context_ids_is_what_one_pass_over_the_whole_laid_out_call_predicts(lively_backbone, form):
    """The context fed one id a step reads as it would prefilled (as training lays it out): each argument token
    decoded after it is the greedy choice of a single forward pass over the conversation and the call."""
    model = city_count_model(lively_backbone, **form)
    config = DecodeConfig(max_new_tokens=24, max_steps=1, schema=False, references=False)
    cache = tokmem.ChatCache()
    tokmem.chat(model, example_messages(city_count_chain())[:1], tool_choice="required", config=config, cache=cache)
    ids = torch.tensor([cache.ids])
    hidden, _ = model.hidden(ids, torch.ones_like(ids))
    predicted = model.logits(hidden[0])[:, : model.vocab_size].argmax(-1)  # one memory token a turn: words only after
    memory = next(k for k, token in enumerate(cache.ids) if token >= model.vocab_size)
    arguments = memory + 1 + len(model.tail_ids(cache.ids[memory]))
    assert cache.ids[memory + 1 : arguments] == model.tail_ids(cache.ids[memory])
    assert predicted[arguments - 1 : -1].tolist() == cache.ids[arguments:]
    assert len(cache.ids) - arguments >= 5  # the arguments were decoded: the comparison covers them


def test_generate_still_refuses_a_bank_that_shows_its_schemas(lively_backbone):
    model = city_count_model(lively_backbone, shows_schemas=True)
    with pytest.raises(BankError, match="shows its tools' schemas .* generate .* does not decode such a bank"):
        tokmem.generate(model, ["Weather in Rome?"])
