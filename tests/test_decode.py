"""Routing and generation: batching, the KV cache, the open-set fallback, forcing, chaining and sampling.

These run on the livelier copy of tiny-random (see conftest): tiny-random itself repeats one token forever,
which would make every comparison below pass trivially.
"""

from dataclasses import replace

import pytest
import torch
from helpers import QUERIES, random_rows
from transformers import DynamicCache

import tokmem
from tokmem import DecodeConfig
from research.methods.method import first_block
from tokmem.decoding.batch import left_pad
from tokmem.decoding.decode import HeldPrefix, complete, decode_rows
from tokmem.decoding.stopping import BlankLineStop
from tokmem.training.sequences import chat_prefix, chat_turns
from tokmem.model import positions


@pytest.fixture(params=[False, True], ids=["coupled", "decoupled"])
def model(request, lively_backbone):
    """Three random rows, scaled so that memory tokens and words both show up in greedy output."""
    model = tokmem.create(lively_backbone, decoupled=request.param)
    model.bank.add(["a", "b", "c"], lively_backbone.mean_embedding())
    random_rows(model.bank, scale=0.7)
    return model


def prefix_ids(model, query) -> torch.Tensor:
    return torch.tensor([chat_prefix(model.backbone.tokenizer, query)])


@torch.no_grad()
def hidden_states(model, query) -> torch.Tensor:
    ids = prefix_ids(model, query)
    return model.hidden(ids, torch.ones_like(ids))[0][0]


@torch.no_grad()
def decode_without_cache(model, query, first, max_new_tokens, max_steps) -> list[int]:
    """Reference greedy decoder: re-runs the whole sequence at every step, no cache, no padding."""
    vocab, eos = model.vocab_size, model.backbone.eos_token_id
    tokens = [first]
    while len(tokens) < max_new_tokens and tokens[-1] != eos:
        ids = torch.cat([prefix_ids(model, query), torch.tensor([tokens])], dim=1)
        hidden, _ = model.hidden(ids, torch.ones_like(ids))
        logits = model.logits(hidden[0, -1])
        if sum(t >= vocab for t in tokens) >= max_steps:
            logits[vocab:] = float("-inf")
        tokens.append(int(logits.argmax()))
    return tokens


def segments(model, tokens) -> list[tuple]:
    """(procedure, text) per segment of a token sequence that starts with a memory token."""
    out = []
    for token in tokens:
        if token == model.backbone.eos_token_id:
            break
        if token >= model.vocab_size:
            out.append((model.bank.names[token - model.vocab_size], []))
        else:
            out[-1][1].append(token)
    return [(name, model.backbone.tokenizer.decode(ids, skip_special_tokens=True).strip()) for name, ids in out]


def pairs(generation) -> list[tuple]:
    return [(s.procedure, s.text) for s in generation.trace]


def rig(model, name, query) -> None:
    """Point ``name``'s index row along the hidden state at ``query``'s routing position, a hundredfold."""
    model.bank.index[model.bank.row(name)] = 100 * hidden_states(model, query)[-1]


# ---- routing ------------------------------------------------------------------------------------
def test_route_returns_top_k_procedures_with_probabilities_over_memory_tokens(model):
    routes = tokmem.route(model, QUERIES, k=2, batch_size=2)
    vocab = model.vocab_size
    for query, route in zip(QUERIES, routes):
        probs = model.logits(hidden_states(model, query)[-1]).softmax(-1)
        mass = probs[vocab:].sum()
        memory = (probs[vocab:] / mass).tolist()
        names, values = zip(*route.candidates)
        assert route.query == query
        assert len(route.candidates) == 2
        assert list(values) == sorted(values, reverse=True)
        assert sum(values) <= 1 + 1e-6
        assert 0 <= route.memory_mass <= 1
        assert route.memory_mass == pytest.approx(float(mass), abs=1e-5)
        assert list(values) == pytest.approx([memory[model.bank.row(n)] for n in names], rel=1e-3, abs=1e-9)
        assert route.best == names[0]
    every = tokmem.route(model, QUERIES, k=10)
    assert all(len(r.candidates) == 3 and sum(p for _, p in r.candidates) == pytest.approx(1) for r in every)


def test_a_hand_set_row_wins_routing(model):
    assert {r.best for r in tokmem.route(model, QUERIES[:2])} == {"b"}
    rig(model, "a", QUERIES[0])
    rig(model, "c", QUERIES[1])
    first, second = tokmem.route(model, QUERIES[:2])
    assert (first.best, second.best) == ("a", "c")
    assert first.memory_mass == pytest.approx(1) and first.candidates[0][1] == pytest.approx(1)


@pytest.mark.parametrize("forced", ["b", "c"])
def test_a_forced_procedure_comes_first_whatever_routing_says(model, forced):
    rig(model, "a", QUERIES[0])
    config = DecodeConfig(max_new_tokens=8)
    assert tokmem.generate(model, QUERIES[:1], config)[0].trace[0].procedure == "a"
    generation = tokmem.generate(model, QUERIES[:1], config, procedure=forced)[0]
    assert generation.routed and generation.trace[0].procedure == forced


# ---- greedy generation --------------------------------------------------------------------------
@pytest.mark.parametrize("threshold", [0.0, 1.01], ids=["routed", "plain"])
@pytest.mark.parametrize("batch_size", [2, 16])
def test_batched_generation_equals_one_query_at_a_time(model, threshold, batch_size):
    config = DecodeConfig(max_new_tokens=24, threshold=threshold, batch_size=batch_size)
    batched = tokmem.generate(model, QUERIES, config)
    single = [tokmem.generate(model, [q], config)[0] for q in QUERIES]
    assert [pairs(g) for g in batched] == [pairs(g) for g in single]
    assert [g.memory_mass for g in batched] == pytest.approx([g.memory_mass for g in single], abs=1e-5)
    assert len({g.text for g in single}) == len(QUERIES)  # the outputs differ, so the comparison means something


TURNS = [
    {"role": "user", "content": "Put the word in quotes. Reply with the result only.\n\nPut sun in quotes."},
    {"role": "assistant", "content": '"sun"'},
]


@pytest.mark.parametrize("threshold", [0.0, 1.01], ids=["routed", "plain"])
@pytest.mark.parametrize("batch_size", [2, 16])
def test_a_shared_prompt_prefix_encoded_once_gives_the_same_generations(model, threshold, batch_size):
    conversations = [TURNS + [{"role": "user", "content": q}] for q in QUERIES]
    config = DecodeConfig(max_new_tokens=24, threshold=threshold, batch_size=batch_size)
    shared = tokmem.generate(model, conversations, replace(config, share_prefix=True))
    separate = tokmem.generate(model, conversations, config)
    assert [pairs(g) for g in shared] == [pairs(g) for g in separate]
    assert [g.memory_mass for g in shared] == pytest.approx([g.memory_mass for g in separate], abs=1e-5)
    assert len({g.text for g in separate}) == len(QUERIES)  # the outputs differ, so the comparison means something


def test_a_prefix_held_across_calls_gives_the_generations_of_fresh_calls_whatever_each_call_shares(model):
    """Each call shares another prefix with the last: longer (extended), shorter (cropped), the same, or none."""
    config = DecodeConfig(max_new_tokens=24, threshold=1.01, share_prefix=True)
    other = [{"role": "user", "content": "Say it backwards."}, {"role": "assistant", "content": "nus"}]
    calls = [
        [
            TURNS[:1] + [{"role": "assistant", "content": a}, {"role": "user", "content": q}]
            for a, q in zip("xy", QUERIES)
        ],
        [TURNS + [{"role": "user", "content": q}] for q in QUERIES],
        [TURNS + [{"role": "user", "content": q}] for q in QUERIES[:2]],
        [TURNS[:1] + [{"role": "assistant", "content": "z"}, {"role": "user", "content": q}] for q in QUERIES],
        [other + [{"role": "user", "content": q}] for q in QUERIES],
    ]
    held = HeldPrefix()
    for conversations in calls:
        kept = tokmem.generate(model, conversations, config, held=held)
        fresh = tokmem.generate(model, conversations, config)
        assert [pairs(g) for g in kept] == [pairs(g) for g in fresh]
        assert held.cache.get_seq_length() == len(held.ids) > 0


def test_left_padded_rows_count_positions_from_their_first_real_token():
    # Output comparisons cannot pin this on a RoPE backbone: a constant shift of positions changes nothing there.
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]])
    assert positions(mask)[mask.bool()].tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 0]


def test_kv_cache_generation_equals_rerunning_the_full_sequence(model):
    config = DecodeConfig(max_new_tokens=24, max_steps=24)
    generations = tokmem.generate(model, QUERIES, config, procedure="a")
    expected = [decode_without_cache(model, q, model.memory_id("a"), 24, 24) for q in QUERIES]
    assert [pairs(g) for g in generations] == [segments(model, tokens) for tokens in expected]
    assert any(
        model.is_memory(torch.tensor(tokens[1:])).any() for tokens in expected
    )  # memory tokens were fed mid-answer


@pytest.mark.parametrize("scale, threshold", [(None, 0.5), (0.7, 1.01)], ids=["fresh-rows", "threshold-above-1"])
def test_open_set_fallback_answers_like_the_plain_backbone(lively_backbone, scale, threshold):
    model = tokmem.create(lively_backbone)
    model.bank.add(["a", "b"], lively_backbone.mean_embedding())
    if scale:
        random_rows(model.bank, scale=scale)
    generations = tokmem.generate(model, QUERIES, DecodeConfig(max_new_tokens=16, threshold=threshold))
    tokenizer = lively_backbone.tokenizer
    for query, generation in zip(QUERIES, generations):
        ids = prefix_ids(model, query)
        plain = lively_backbone.model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False
        )
        text = tokenizer.decode(plain[0, ids.shape[1] :], skip_special_tokens=True).strip()
        assert generation.memory_mass < threshold
        assert not generation.routed
        assert pairs(generation) == [(None, text)]


@pytest.mark.parametrize("threshold", [0.0, 0.5])
def test_an_empty_bank_answers_every_query_as_the_plain_backbone(lively_backbone, threshold):
    model = tokmem.create(lively_backbone)
    routes = tokmem.route(model, QUERIES)
    assert all(r.candidates == [] and r.best is None and r.memory_mass == 0 for r in routes)
    generations = tokmem.generate(model, QUERIES, DecodeConfig(max_new_tokens=8, threshold=threshold))
    assert all(not g.routed and g.procedures == [] and len(g.trace) == 1 for g in generations)


def test_chaining_stops_after_max_steps_segments_and_at_max_new_tokens(lively_backbone):
    model = tokmem.create(lively_backbone)
    model.bank.add(["a"], lively_backbone.mean_embedding())
    model.bank.index[0] = 100 * torch.cat([hidden_states(model, q) for q in QUERIES]).mean(0)
    memory = model.memory_id("a")
    # dominance: with no step limit the model emits nothing but the memory token
    assert all(decode_without_cache(model, q, memory, 12, 12) == [memory] * 12 for q in QUERIES)

    generations = tokmem.generate(model, QUERIES, DecodeConfig(max_new_tokens=12, max_steps=3))
    for query, generation in zip(QUERIES, generations):
        expected = decode_without_cache(model, query, memory, 12, 3)
        assert len(expected) == 12 and model.backbone.eos_token_id not in expected
        assert generation.routed and generation.memory_mass == pytest.approx(1)
        assert generation.procedures == ["a", "a", "a"]
        assert pairs(generation) == segments(model, expected)


# ---- completing laid-out contexts ---------------------------------------------------------------------
@torch.no_grad()
def complete_without_cache(model, context, max_new_tokens) -> str:
    """Reference: re-run the whole sequence at every step, greedy over the vocabulary alone, up to EOS."""
    new = []
    while len(new) < max_new_tokens:
        ids = torch.tensor([context + new])
        hidden, _ = model.hidden(ids, torch.ones_like(ids))
        token = int(model.logits(hidden[0, -1])[: model.vocab_size].argmax())
        if token == model.backbone.eos_token_id:
            break
        new.append(token)
    return model.backbone.tokenizer.decode(new, skip_special_tokens=True).strip()


def test_complete_continues_contexts_with_a_memory_token_inside_like_rerunning_each_alone(model):
    tokenizer = model.backbone.tokenizer
    contexts = []
    for query, name in zip(
        QUERIES, "abcab"
    ):  # unequal lengths: left padding; the memory token before the assistant header
        turn, header = chat_turns(tokenizer, query)
        contexts.append(turn + [model.memory_id(name)] + header)
    answers = complete(model, contexts, DecodeConfig(max_new_tokens=12, batch_size=2))
    assert answers == [complete_without_cache(model, c, 12) for c in contexts]
    assert len(set(answers)) > 1  # the outputs differ, so the comparison means something


# ---- sampling -----------------------------------------------------------------------------------
def test_sampling_is_reproducible_per_seed_and_varies_across_seeds(model):
    def sample(seed):
        config = DecodeConfig(max_new_tokens=16, threshold=0.0, temperature=1.0, seed=seed)
        return [pairs(g) for g in tokmem.generate(model, QUERIES, config)]

    assert sample(0) == sample(0)
    assert sample(0) != sample(1)


def test_a_tool_rows_segment_comes_back_as_the_whole_call(lively_backbone):
    model = tokmem.create(lively_backbone)
    model.bank.add(["text_row", "tool_row"], lively_backbone.mean_embedding(), kinds=["text", "tool"])
    random_rows(model.bank, scale=0.7)
    config = DecodeConfig(max_new_tokens=6, max_steps=1)
    plain = tokmem.generate(model, ["hi"], config, procedure="text_row")[0].trace[0]
    model.bank.kinds = ["tool", "tool"]  # the same generated tokens, read as a tool's arguments
    call = tokmem.generate(model, ["hi"], config, procedure="text_row")[0].trace[0]
    assert call.procedure == "text_row"
    assert call.text == '{"name":"text_row","arguments":' + plain.text + "}"


@pytest.mark.parametrize(
    "text, stop",
    [
        ("\n\nab\ncd\n\nef", 8),  # leading blank lines are not the end: the answer has not started
        ("ab\n\n", 3),  # within the text
        ("a\n \nb\n\n", 6),  # a line of spaces is not a blank line
        ("abc", None),
    ],
)
def test_blank_line_stop_finds_the_first_blank_line_after_some_text(backbone, text, stop):
    ids = backbone.tokenizer(text, add_special_tokens=False).input_ids
    assert len(ids) == len(text)  # the tiny model's tokenizer: one token a byte
    stopper = BlankLineStop(backbone.tokenizer, backbone.vocab_size, "cpu")
    stops = [bool(stopper.update(torch.tensor([i]))) for i in ids]
    assert (stops.index(True) if True in stops else None) == stop


def test_stopping_at_a_blank_line_keeps_the_text_up_to_it(lively_backbone):
    model = tokmem.create(lively_backbone)
    queries = [f"Write two paragraphs about {w}." for w in ("tea", "rain", "bees", "maps")]
    config = DecodeConfig(max_new_tokens=48, batch_size=4)
    whole = [g.text for g in tokmem.generate(model, queries, config)]
    stopped = [g.text for g in tokmem.generate(model, queries, replace(config, stop_at_blank_line=True))]
    assert [first_block(t) for t in stopped] == [first_block(t) for t in whole]
    assert all(whole_text.startswith(text) for text, whole_text in zip(stopped, whole))


class EndAt:
    """A stopping rule (``tokmem.decoding.stopping``' shape) that ends row ``row`` at its ``count``-th token."""

    def __init__(self, row: int, count: int):
        self.row, self.count, self.seen = row, count, 0

    def update(self, token: torch.Tensor) -> torch.Tensor:
        self.seen += 1
        done = torch.zeros_like(token, dtype=torch.bool)
        done[self.row] = self.seen == self.count
        return done


def test_a_stopping_rule_ends_its_row_and_the_other_rows_decode_as_without_it(model):
    tokenizer, eos = model.backbone.tokenizer, model.backbone.eos_token_id
    ids, mask = left_pad([chat_prefix(tokenizer, q) for q in QUERIES[:3]], tokenizer.pad_token_id, model.device)
    config = DecodeConfig(max_new_tokens=16, threshold=0.0)

    def run(stops) -> list[list[int]]:
        cache, forced = DynamicCache(config=model.lm.config), torch.full((3,), -1)
        return decode_rows(model, ids, mask, cache, config, forced, torch.Generator(), stops=stops)[0]

    free, stopped = run(()), run([EndAt(row=1, count=3)])
    assert eos not in free[1][:4]  # the rule, not EOS, ends the row
    assert stopped[1][:3] == free[1][:3] and set(stopped[1][3:]) <= {eos}
    assert all(stopped[i] == free[i][: len(stopped[i])] for i in (0, 2))
