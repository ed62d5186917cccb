"""Context-aware decoding of a call's arguments (``DecodeConfig.context_contrast``): ``tokmem.chat`` picks each
argument token from the conversation's logits contrasted with those of a twin that has the same memory token but
no conversation (``decode.contrasted_logits``)."""

import math
from dataclasses import replace

import pytest
import torch
from helpers import city_count_model

import tokmem
from tokmem import DecodeConfig
from tokmem.decoding.conversation import conversation_ids
from tokmem.decoding.decode import argument_grammar, contrasted_logits
from tokmem.model import positions

CONFIG = DecodeConfig(max_new_tokens=24, references=False)
COUNT = [{"type": "function", "function": {"name": "count"}}]
QUERIES = [
    [{"role": "user", "content": "Count the apples in Oslo, please."}],
    [{"role": "user", "content": "How many pears are there in Rome today?"}],
]


@pytest.fixture
def tools(lively_backbone):
    return city_count_model(lively_backbone)


def test_contrasted_logits_move_each_active_row_from_its_twin_by_their_divergence_and_give_the_twin_the_same():
    inf = float("inf")
    own = torch.tensor([[1.0, 2.0, -inf], [0.0, 1.0, 2.0], [3.0, 0.0, 1.0]])
    twin = torch.tensor([[2.0, 0.0, -inf], [5.0, 5.0, 5.0], [3.0, 0.0, 1.0]])
    mixed = contrasted_logits(torch.cat([own, twin]), strength=2.0, active=torch.tensor([True, False, True]))
    p, q = own[0, :2].softmax(-1), twin[0, :2].softmax(-1)
    m = (p + q) / 2
    bits = float(((p * (p / m).log2()).sum() + (q * (q / m).log2()).sum()) / 2)
    assert 0 < bits < 1
    assert torch.allclose(mixed[0, :2], own[0, :2] + 2.0 * bits * (own[0, :2] - twin[0, :2]))
    assert mixed[0, 2] == -inf  # masked in both: stays masked
    assert torch.equal(mixed[1], own[1])  # not active: its own logits
    assert torch.equal(mixed[2], own[2])  # the twin predicts the same: nothing to contrast
    assert torch.equal(mixed[3:], mixed[:3])


def reference_arguments(model, messages, tool: str, strength: float) -> str:
    """The call's arguments decoded without a cache, one full forward pass a token for the conversation and for the
    bare twin, each token the grammar-allowed argmax of the logits contrasted by their divergence in bits."""
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
        p, q = own.softmax(-1), twin.softmax(-1)
        m = (p + q) / 2
        bits = (torch.special.xlogy(p, p / m).sum() + torch.special.xlogy(q, q / m).sum()) / 2 / math.log(2)
        logits = own + strength * float(bits) * (own - twin)
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
