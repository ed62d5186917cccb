"""TokMemModel: memory ids, the two places the bank enters the frozen network, and what stays frozen."""

import math

import pytest
import torch
from helpers import random_rows

import tokmem
from tokmem import Example, Step, TrainConfig
from tokmem.backbones import CPU_BF16, cpu_has_bf16, default_dtype
from tokmem.errors import BackboneError, BankError
from tokmem.training.loss import (
    _packing_pays,
    _shared_width,
    _split_prefix,
    batch_loss,
    key_choice_weights,
    label_weights,
    next_token_loss,
)
from tokmem.training.prefix_store import PrefixStore
from tokmem.training.sequences import ANSWER, IGNORE, collate, encode


@pytest.fixture(params=[False, True], ids=["coupled", "decoupled"])
def filled(request, backbone):
    """A model whose bank has three rows with random (and, for DC, different steer and index) values."""
    model = tokmem.create(backbone, decoupled=request.param)
    model.bank.add(["a", "b", "c"], backbone.mean_embedding())
    random_rows(model.bank)
    return model


def vocabulary_shapes(backbone) -> tuple:
    return (
        tuple(backbone.model.get_input_embeddings().weight.shape),
        tuple(backbone.model.get_output_embeddings().weight.shape),
        backbone.model.config.vocab_size,
        len(backbone.tokenizer),
    )


def test_memory_ids_are_vocab_size_plus_row(model, backbone):
    model.bank.add(["a", "b", "c"], backbone.mean_embedding())
    assert model.vocab_size == len(backbone.tokenizer) == 259
    assert [model.memory_id(n) for n in "abc"] == [259, 260, 261]
    assert model.is_memory(torch.tensor([0, 258, 259, 261])).tolist() == [False, False, True, True]
    with pytest.raises(BankError, match="no procedure 'z'"):
        model.memory_id("z")


def test_embed_uses_steer_rows_for_memory_ids_and_the_backbone_for_words(filled, backbone):
    ids = torch.tensor([[5, filled.memory_id("c"), 100], [filled.memory_id("a"), 258, filled.memory_id("a")]])
    embedded = filled.embed(ids)
    table = backbone.model.get_input_embeddings().weight
    steer = filled.bank.steer_matrix  # for DC the steer matrix, which random_rows made differ from index
    assert torch.equal(embedded[0, [0, 2]], table[[5, 100]])
    assert torch.equal(embedded[1, 1], table[258])
    assert torch.equal(embedded[0, 1], steer[2])
    assert torch.equal(embedded[1, [0, 2]], steer[[0, 0]])
    assert torch.equal(filled.embed(torch.tensor([7, 258])), table[[7, 258]])


def test_logits_extend_the_lm_head_with_hidden_times_index(filled, backbone):
    hidden = torch.randn(2, 5, backbone.hidden_size, generator=torch.Generator().manual_seed(1))
    logits = filled.logits(hidden)
    assert logits.shape == (2, 5, filled.vocab_size + 3)
    torch.testing.assert_close(logits[..., : filled.vocab_size], backbone.model.lm_head(hidden))
    torch.testing.assert_close(logits[..., filled.vocab_size :], hidden @ filled.bank.index.T)


def test_vocabulary_is_never_resized(backbone, examples):
    before = vocabulary_shapes(backbone)
    model = tokmem.create(backbone)
    model.bank.add(["x"], backbone.mean_embedding())
    tokmem.learn(model, examples, TrainConfig(max_steps=2, progress=False))
    assert len(model.bank) == 3
    assert vocabulary_shapes(backbone) == before


def test_no_backbone_parameter_ever_requires_grad(backbone, examples):
    model = tokmem.create(backbone)
    assert not any(p.requires_grad for p in backbone.model.parameters())
    model.bank.add(["reverse", "upper"], backbone.mean_embedding())
    model.unfreeze_rows()
    assert [name for name, p in model.named_parameters() if p.requires_grad] == ["row_index"]
    model.commit_rows()
    tokmem.train(model, examples, TrainConfig(max_steps=2, progress=False))
    assert not any(p.requires_grad for p in model.parameters())


def test_load_resolves_the_backbone_named_in_the_bank(tmp_path, backbone):
    model = tokmem.create(backbone)
    model.bank.add(["a"], backbone.mean_embedding())
    path = model.bank.save(tmp_path / "bank.safetensors")
    loaded = tokmem.load(path, device="cpu")
    assert loaded.backbone is not backbone and loaded.backbone.name == "tiny-random"
    assert loaded.bank.names == ["a"]
    assert torch.equal(loaded.bank.index, model.bank.index)


def full_sequence_loss(model, batch):
    """The loss computed the plain way: the whole sequence through the network with gradients."""
    index, steer = model.memory_matrices()
    hidden, _ = model.hidden(batch["input_ids"], batch["attention_mask"], steer=steer)
    labels = batch["labels"][:, 1:]
    where = labels != IGNORE
    return torch.nn.functional.cross_entropy(model.logits(hidden[:, :-1][where], index).float(), labels[where])


@pytest.mark.parametrize("rows", [3, 1], ids=["batch", "one-row"])
def test_loss_with_the_query_prefix_cached_equals_the_full_sequence_loss_and_gradients(filled, backbone, rows):
    examples = [
        Example("Reverse the word apple, please, right now.", (Step("a", "elppa"),)),
        Example("hi", (Step("b", "one two three four"), Step("c", "x"))),
        Example("Count: 1 2", (Step("c", "2"),)),
    ][:rows]
    tokenizer = backbone.tokenizer
    batch = collate([encode(e, tokenizer, filled.memory_id, 1024) for e in examples], tokenizer.pad_token_id)
    starts = (batch["labels"] != IGNORE).int().argmax(-1)
    shared = _split_prefix(batch, starts, _shared_width(batch["input_ids"], starts))[0]
    assert tokenizer.decode(shared[0]).startswith("<|im_start|>user")  # encoded once for all rows
    rows = filled.unfreeze_rows()
    cached, count = batch_loss(filled, batch)
    cached_grads = torch.autograd.grad(cached, rows)
    full = full_sequence_loss(filled, batch)
    full_grads = torch.autograd.grad(full, rows)
    assert count == int((batch["labels"][:, 1:] != IGNORE).sum())
    assert cached.item() == pytest.approx(full.item(), rel=1e-5)
    for a, b in zip(cached_grads, full_grads):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)


def test_prefixes_kept_in_a_store_give_the_full_sequence_loss_and_gradients_whether_stored_or_new(filled, backbone):
    examples = [
        Example("Reverse the word apple, please, right now.", (Step("a", "elppa"),)),
        Example("hi", (Step("b", "one two three four"), Step("c", "x"))),
        Example("Count: 1 2", (Step("c", "2"),)),
    ]
    tokenizer = backbone.tokenizer
    encoded = [encode(e, tokenizer, filled.memory_id, 1024) for e in examples]
    batch = collate(encoded, tokenizer.pad_token_id)
    store = PrefixStore(budget=2**30)
    rows = filled.unfreeze_rows()
    batch_loss(filled, collate(encoded[1:2], tokenizer.pad_token_id), store)  # one row stored, two new in the batch
    assert len(store.entries) == 1
    full_grads = torch.autograd.grad(full_sequence_loss(filled, batch), rows)
    for expected_entries in (3, 3):  # a mixed batch, then every row from the store
        stored, _ = batch_loss(filled, batch, store)
        assert len(store.entries) == expected_entries
        assert stored.item() == pytest.approx(full_sequence_loss(filled, batch).item(), rel=1e-5)
        for a, b in zip(torch.autograd.grad(stored, rows), full_grads):
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)


def test_a_store_keeps_prefixes_only_while_its_budget_lasts_and_the_loss_is_the_same(filled, backbone):
    examples = [Example(f"Reverse {w}.", (Step("a", w[::-1]),)) for w in ("sun", "apple", "window", "blueberry")]
    tokenizer = backbone.tokenizer
    batch = collate([encode(e, tokenizer, filled.memory_id, 1024) for e in examples], tokenizer.pad_token_id)
    unbounded, bounded = PrefixStore(budget=2**30), PrefixStore(budget=0)
    batch_loss(filled, batch, unbounded)
    one = unbounded.used // len(examples) + 1  # the prefixes differ in length by a few tokens
    bounded.budget = 2 * one
    expected = batch_loss(filled, batch)[0].item()
    for _ in range(2):
        assert batch_loss(filled, batch, bounded)[0].item() == pytest.approx(expected, rel=1e-5)
        assert 0 < bounded.used <= bounded.budget and len(bounded.entries) < len(examples)


@pytest.mark.parametrize(("setting", "dtype"), [("0", torch.float32), ("1", torch.bfloat16)])
def test_tokmem_cpu_bf16_sets_the_cpu_backbones_dtype(monkeypatch, setting, dtype):
    monkeypatch.setenv(CPU_BF16, setting)
    assert default_dtype("cpu") == dtype
    assert default_dtype("cuda") == torch.bfloat16


def test_unset_a_cpu_backbone_is_bf16_exactly_where_the_cpu_multiplies_bf16(monkeypatch):
    monkeypatch.delenv(CPU_BF16)
    assert default_dtype("cpu") == (torch.bfloat16 if cpu_has_bf16() else torch.float32)


def test_a_bad_cpu_bf16_setting_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv(CPU_BF16, "yes")
    with pytest.raises(BackboneError, match=r"\$TOKMEM_CPU_BF16 is 'yes'"):
        default_dtype("cpu")


def test_a_bf16_cpu_backbone_trains_float32_rows_with_kept_prefixes_and_stays_bit_identical(examples):
    backbone = tokmem.load_backbone("tiny-random", device="cpu", dtype=torch.bfloat16)
    before = {k: v.clone() for k, v in backbone.model.state_dict().items()}
    model = tokmem.create(backbone)
    report = tokmem.learn(model, examples, TrainConfig(epochs=2, lr=0.05, progress=False))
    assert model.bank.index.dtype == torch.float32 and report.prefix_cache_bytes > 0
    assert all(math.isfinite(loss) for loss in report.losses)
    assert (model.bank.index - backbone.mean_embedding()).abs().max() > 0.01
    assert all(torch.equal(v, before[k]) for k, v in backbone.model.state_dict().items())


def test_the_answer_label_is_the_probability_of_any_vocabulary_token_and_trains_memory_mass_down(backbone):
    vocab = backbone.vocab_size
    logits = torch.randn(2, vocab + 3, generator=torch.Generator().manual_seed(0))
    logits[:, vocab:] += 8  # the memory tokens are likely
    memory_mass = logits.softmax(-1)[:, vocab:].sum(-1)
    loss = next_token_loss(logits, torch.tensor([ANSWER, ANSWER]), vocab)
    assert loss.item() == pytest.approx(-(1 - memory_mass).log().mean().item(), rel=1e-4)
    mixed = next_token_loss(logits, torch.tensor([ANSWER, 5]), vocab)
    word = torch.nn.functional.cross_entropy(logits[1:], torch.tensor([5]))
    assert mixed.item() == pytest.approx(((-(1 - memory_mass[0]).log() + word) / 2).item(), rel=1e-4)


def test_an_unknown_random_shape_is_refused_with_the_known_ones():
    with pytest.raises(BackboneError, match="llama-3.2-1b"):
        tokmem.load_backbone("random:no-such-shape", device="cpu")


def test_a_batchs_suffixes_run_packed_in_one_row_without_their_padding(filled, backbone):
    examples = [
        Example("Reverse the word apple, please, right now.", (Step("a", "elppa"),)),
        Example("hi", (Step("b", "one two three four five six seven"),)),
    ]
    tokenizer = backbone.tokenizer
    batch = collate([encode(e, tokenizer, filled.memory_id, 1024) for e in examples], tokenizer.pad_token_id)
    store = PrefixStore(budget=2**30)
    batch_loss(filled, batch, store)  # the prefixes kept: the next loss runs the suffix pass only
    shapes = []
    hook = filled.lm.base_model.register_forward_pre_hook(
        lambda module, args, kwargs: shapes.append(tuple(kwargs["inputs_embeds"].shape[:2])), with_kwargs=True
    )
    try:
        packed, _ = batch_loss(filled, batch, store)
    finally:
        hook.remove()
    starts = (batch["labels"] != IGNORE).int().argmax(-1)
    real = int((batch["attention_mask"].sum(-1) - starts).sum())
    assert shapes == [(1, real)] and real < 2 * int((batch["attention_mask"].sum(-1) - starts).max())
    assert packed.item() == pytest.approx(full_sequence_loss(filled, batch).item(), rel=1e-5)


def test_suffixes_pack_when_padding_costs_more_than_the_attention_across_rows_and_not_otherwise():
    def pays(suffix_lengths, prefix_lengths, width=896):
        real = torch.arange(max(suffix_lengths)) < torch.tensor(suffix_lengths).unsqueeze(-1)
        prefix = torch.arange(max(prefix_lengths)) >= (max(prefix_lengths) - torch.tensor(prefix_lengths)).unsqueeze(-1)
        return _packing_pays(real, prefix.long(), width)

    assert pays([3, 5, 12, 63], [150, 170, 160, 180])  # SNI: short uneven answers after long queries
    assert not pays([1100, 1080], [200, 210])  # a tool loop's records: long suffixes, little padding
    assert not pays([7, 7], [20, 20])  # no padding at all


@pytest.fixture(scope="module")
def smollm():
    """The built-in backbone, for its real tokenizer (tiny-random's writes JSON one character a token)."""
    return tokmem.load_backbone("smollm2-135m", device="cpu")


def test_the_key_choice_weight_falls_on_a_values_end_and_the_next_keys_first_token_only(smollm):
    model = tokmem.create(smollm)
    tokenizer = smollm.tokenizer
    arguments = '{"query":"Paris, France","adults":2,"sort_by":"price"}'
    ids = tokenizer(arguments, add_special_tokens=False)["input_ids"]
    labels = torch.tensor([[IGNORE, *ids]])
    weights = key_choice_weights(model, labels, 4.0)[0, 1:]
    weighted = [tokenizer.decode([i]) for i, w in zip(ids, weights.tolist()) if w == 4.0]
    assert weighted == ['","', "ad", ',"', "sort", '"}']  # the comma inside "Paris, France" is not one
    assert set(weights.tolist()) == {1.0, 4.0}


@pytest.mark.parametrize(
    "choice_weight, route_weight, weighted_labels",
    [(3.0, 1.0, {3.0: 3}), (1.0, 5.0, {5.0: 1}), (3.0, 5.0, {3.0: 3, 5.0: 1})],
    ids=["key-choice", "route", "both"],
)
def test_loss_weights_weigh_their_labels_in_the_mean_loss_and_one_leaves_it_unchanged(
    smollm, choice_weight, route_weight, weighted_labels
):
    """Key choice: the value's end that goes on, the next key, the close; route: the one memory token."""
    model = tokmem.create(smollm)
    model.bank.add(["search"], smollm.mean_embedding(), kinds=["tool"])
    example = Example(
        "Hotels in Paris for two", (Step("search", '{"name":"search","arguments":{"city":"Paris","n":2}}'),)
    )
    batch = collate([encode(example, smollm.tokenizer, model.memory_id, 1024, tools={"search"})], 0)
    hidden, _ = model.hidden(batch["input_ids"], batch["attention_mask"])
    labels = batch["labels"][:, 1:]
    where = labels != IGNORE
    losses = torch.nn.functional.cross_entropy(
        model.logits(hidden[:, :-1][where]).float(), labels[where], reduction="none"
    )
    weights = label_weights(model, labels, choice_weight, route_weight)[where]
    assert {w: int((weights == w).sum()) for w in weights.unique().tolist() if w != 1} == weighted_labels
    if route_weight != 1:
        assert labels[where][weights == route_weight].tolist() == [model.memory_id("search")]
    weighted, count = batch_loss(model, batch, choice_weight=choice_weight, route_weight=route_weight)
    assert weighted.item() == pytest.approx((losses * weights).mean().item(), rel=1e-4)
    assert batch_loss(model, batch)[0].item() == pytest.approx(losses.mean().item(), rel=1e-4) != weighted.item()
    assert count == int(where.sum())
