"""Context-aware decoding of a call's arguments (``DecodeConfig.context_contrast``): ``tokmem.chat`` picks each
argument token from the conversation's logits contrasted with those of a twin that has the same memory token but
no conversation (``decode.contrasted_logits``)."""

from dataclasses import replace

import pytest
import torch
from helpers import city_count_model

import tokmem
from tokmem import DecodeConfig
from tokmem.chat import conversation_ids
from tokmem.decode import argument_grammar, contrasted_logits
from tokmem.sequences import positions

CONFIG = DecodeConfig(max_new_tokens=24, references=False)
COUNT = [{"type": "function", "function": {"name": "count"}}]
QUERIES = [
    [{"role": "user", "content": "Count the apples in Oslo, please."}],
    [{"role": "user", "content": "How many pears are there in Rome today?"}],
]


@pytest.fixture
def tools(lively_backbone):
    return city_count_model(lively_backbone)


def test_contrasted_logits_move_each_active_row_away_from_its_twin_and_give_the_twin_the_same():
    inf = float("inf")
    own = torch.tensor([[1.0, 2.0, -inf], [0.0, 1.0, 2.0]])
    twin = torch.tensor([[2.0, 0.0, 0.0], [5.0, 5.0, 5.0]])
    mixed = contrasted_logits(torch.cat([own, twin]), strength=1.0, active=torch.tensor([True, False]))
    assert mixed[0].tolist() == [0.0, 4.0, -inf]  # 2·own − twin; a masked column stays masked
    assert mixed[1].tolist() == own[1].tolist()  # not active: its own logits
    assert torch.equal(mixed[2:], mixed[:2])


def reference_arguments(model, messages, tool: str, strength: float) -> str:
    """The call's arguments decoded without a cache, one full forward pass a token for the conversation and for the
    bare twin, each token the grammar-allowed argmax of the contrasted logits."""
    memory = model.memory_id(tool)
    rows = [
        conversation_ids(model, messages) + [memory],
        conversation_ids(model, [{"role": "user", "content": ""}]) + [memory],
    ]
    grammar = argument_grammar(model, 1, CONFIG)
    grammar.begin([memory])
    index, steer = model.memory_matrices()
    answer = []
    for _ in range(CONFIG.max_new_tokens):
        last = []
        for row in rows:
            ids = torch.tensor([row + answer])
            mask = torch.ones_like(ids)
            last.append(model.logits(model.hidden(ids, mask, positions(mask), steer=steer)[0][:, -1], index).float())
        own, twin = last
        logits = own + strength * (own - twin)
        grammar.constrain(logits)
        logits[:, model.vocab_size :] = float("-inf")  # one call a turn
        token = int(logits.argmax())
        if token == model.backbone.eos_token_id:
            break
        answer.append(token)
        grammar.advance(torch.tensor([token]))
    return model.backbone.tokenizer.decode(answer)


def test_chat_decodes_the_argmax_of_the_contrasted_logits_under_the_grammar(tools):
    strength = 2.0
    reference = [reference_arguments(tools, m, "count", strength) for m in QUERIES]
    plain = [reference_arguments(tools, m, "count", 0.0) for m in QUERIES]
    assert reference != plain  # the contrast changes what this model writes: the comparison below can fail
    config = replace(CONFIG, context_contrast=strength)
    for messages, expected in zip(QUERIES, reference):
        reply = tokmem.chat(tools, messages, tools=COUNT, tool_choice="required", config=config)
        assert reply.tool_calls[0].arguments == expected


def test_contrasted_conversations_decoded_together_answer_as_each_alone(tools):
    config = replace(CONFIG, context_contrast=1.0)
    together = tokmem.chat_batch(tools, QUERIES, tool_choice="required", config=config)
    assert together == [tokmem.chat(tools, m, tool_choice="required", config=config) for m in QUERIES]


def test_contrast_is_refused_where_it_cannot_apply(tools):
    with pytest.raises(ValueError, match="only tokmem.chat"):
        tokmem.generate(tools, ["Count the apples."], replace(CONFIG, context_contrast=1.0))
    with pytest.raises(ValueError, match="greedily"):
        tokmem.chat(
            tools, QUERIES[0], tool_choice="required", config=replace(CONFIG, context_contrast=1.0, temperature=1)
        )
