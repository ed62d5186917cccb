"""Training: only the bank's trainable rows move; the backbone never does; continual rounds; reproducibility."""

import pytest
import torch
from helpers import Interrupted, interrupt_at

import tokmem
from tokmem import Example, Step, TrainConfig
from tokmem.bank.memory_bank import MemoryBank
from tokmem.errors import TokMemError
from tokmem.training.sequences import collate, encode
from tokmem.training.train import example_order, initial_rows, lr_scheduler, row_texts
from tokmem.training.loss import batch_loss


def config(**options) -> TrainConfig:
    return TrainConfig(**{"progress": False, **options})


@pytest.fixture
def second_round():
    """Examples for a new procedure, one of them chained after a procedure the bank already has."""
    double = [Example(f"Double {w}.", (Step("double", w + w),)) for w in ("sun", "moon", "star")]
    return double + [Example("Reverse tree, then double it.", (Step("reverse", "eert"), Step("double", "eerteert")))]


@pytest.fixture
def learned(model, examples):
    """A model after a first continual round (reverse, upper)."""
    tokmem.learn(model, examples, config(epochs=3))
    return model


@pytest.mark.parametrize("decoupled", [False, True])
def test_training_leaves_the_backbone_bit_identical(backbone, examples, second_round, decoupled):
    before = {k: v.clone() for k, v in backbone.model.state_dict().items()}
    model = tokmem.create(backbone, decoupled=decoupled)
    tokmem.learn(model, examples, config(epochs=2, lr=0.1))
    tokmem.learn(model, second_round, config(epochs=2, lr=0.1))
    after = backbone.model.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], before[k]) for k in before)


@pytest.mark.parametrize("decoupled", [False, True])
def test_gradients_reach_only_the_trainable_rows(backbone, examples, decoupled):
    model = tokmem.create(backbone, decoupled=decoupled)
    model.bank.add(["reverse"], backbone.mean_embedding())
    model.bank.freeze()
    model.bank.add(["upper"], backbone.mean_embedding())
    params = model.unfreeze_rows()
    assert len(params) == (2 if decoupled else 1)
    assert all(p.shape == (1, backbone.hidden_size) for p in params)  # the trainable row only
    batch = collate(
        [encode(e, backbone.tokenizer, model.memory_id, 1024) for e in examples], backbone.tokenizer.pad_token_id
    )
    loss, count = batch_loss(model, batch)
    loss.backward()
    assert count == int((batch["labels"][:, 1:] != -100).sum())
    assert all(p.grad is None for p in backbone.model.parameters())
    assert all(p.grad.abs().sum() > 0 for p in params)


def test_a_second_round_leaves_the_frozen_rows_bit_identical(learned, second_round):
    old = learned.bank.index.clone()
    tokmem.learn(learned, second_round, config(epochs=3, lr=0.1))
    assert torch.equal(learned.bank.index[:2], old)
    assert not torch.equal(learned.bank.index[2], learned.backbone.mean_embedding())


def test_loss_decreases_on_a_small_memorisation_task(lively_backbone, examples):
    model = tokmem.create(lively_backbone)  # tiny-random itself can hardly be steered: its loss barely moves
    losses = tokmem.learn(model, examples, config(epochs=100, batch_size=3, lr=2e-2)).losses
    assert len(losses) == 300
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert last < 0.8 * first


def test_learn_adds_only_unseen_procedures_and_freezes_every_other_row(learned, second_round, backbone):
    learned.bank.add(["manual"], backbone.mean_embedding())  # trainable until learn freezes it
    before = learned.bank.index.clone()
    report = tokmem.learn(learned, second_round, config(epochs=1))
    assert report.new_procedures == ["double"]
    assert learned.bank.names == ["reverse", "upper", "manual", "double"]
    assert torch.equal(learned.bank.index[:3], before)
    assert not learned.bank.trainable.any()


def test_learn_renormalises_new_rows_to_the_old_rows_mean_norm(learned, second_round, tmp_path):
    learned.bank.save(tmp_path / "first.safetensors")
    old_norms = learned.bank.norms()
    report = tokmem.learn(learned, second_round, config(epochs=3))
    raw = tokmem.load(tmp_path / "first.safetensors", backbone=learned.backbone)
    tokmem.learn(raw, second_round, config(epochs=3, renormalize=False))

    target = old_norms.mean()
    assert report.renorm_target == pytest.approx(float(target))
    assert float(learned.bank.norms()[2]) == pytest.approx(float(target), rel=1e-5)
    new, unnormalised = learned.bank.index[2], raw.bank.index[2]
    assert float(unnormalised.norm()) != pytest.approx(float(target), rel=0.01)
    torch.testing.assert_close(new, unnormalised * target / unnormalised.norm())


def test_first_round_is_not_renormalised(model, examples):
    assert tokmem.learn(model, examples, config(epochs=1)).renorm_target is None


def trained_index(backbone, examples, **options) -> torch.Tensor:
    model = tokmem.create(backbone)
    model.bank.add(["reverse", "upper"], backbone.mean_embedding())
    tokmem.train(model, examples, config(epochs=2, **options))
    return model.bank.index


def test_training_is_reproducible_for_a_seed(backbone, examples):
    first = trained_index(backbone, examples, seed=3)
    assert torch.equal(first, trained_index(backbone, examples, seed=3))
    assert not torch.equal(first, trained_index(backbone, examples, seed=4))


def test_gradient_accumulation_matches_a_larger_batch(backbone, examples):
    examples = examples[:8]  # two full steps of four
    large = trained_index(backbone, examples, batch_size=4, grad_accum=1)
    accumulated = trained_index(backbone, examples, batch_size=2, grad_accum=2)
    small = trained_index(backbone, examples, batch_size=2, grad_accum=1)
    torch.testing.assert_close(accumulated, large, rtol=0, atol=1e-6)
    assert not torch.allclose(small, large, rtol=0, atol=1e-3)


@pytest.mark.parametrize("decoupled", [False, True])
def test_three_epochs_with_the_prefixes_kept_train_the_rows_that_encoding_them_each_epoch_does(
    backbone, examples, decoupled
):
    def trained(budget: float | None):
        model = tokmem.create(backbone, decoupled=decoupled)
        report = tokmem.learn(model, examples, config(epochs=3, lr=0.05, renormalize=False, prefix_cache_gib=budget))
        return model.bank, report

    encoded_each_epoch, _ = trained(0)
    kept, everything = trained(None)  # the default budget holds every prefix
    half = everything.prefix_cache_bytes / 2
    kept_while_it_lasts, part = trained(half / 2**30)
    assert 0 < part.prefix_cache_bytes <= half
    for bank in (kept, kept_while_it_lasts):
        torch.testing.assert_close(bank.index, encoded_each_epoch.index, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(bank.steer, encoded_each_epoch.steer, rtol=1e-5, atol=1e-6)
    assert (encoded_each_epoch.index - backbone.mean_embedding()).abs().max() > 0.1  # the rows did train


def test_one_epoch_keeps_no_prefixes(model, examples):
    assert tokmem.learn(model, examples, config(epochs=1)).prefix_cache_bytes == 0


def test_checkpoint_writes_a_loadable_bank_of_the_live_rows(model, examples, tmp_path, backbone):
    path = tmp_path / "ckpt" / "bank.safetensors"
    model.bank.add(["reverse", "upper"], backbone.mean_embedding())
    report = tokmem.train(model, examples[:8], config(batch_size=2, checkpoint=str(path), checkpoint_every=2))
    assert report.steps == 4
    checkpoint = MemoryBank.load(path, backbone=backbone)
    assert checkpoint.names == ["reverse", "upper"]
    assert torch.equal(checkpoint.index, model.bank.index)  # written after the last step
    assert not torch.equal(checkpoint.index[0], backbone.mean_embedding())


def test_an_interrupted_training_resumed_from_its_checkpoint_ends_where_an_uninterrupted_one_does(
    backbone, examples, tmp_path
):
    settings = dict(batch_size=2, epochs=2, lr=0.05, schedule="linear", renorm_every_step=True)
    uninterrupted_model = tokmem.create(backbone, decoupled=True)
    uninterrupted = tokmem.learn(uninterrupted_model, examples, config(**settings))
    checkpoint = dict(checkpoint=str(tmp_path / "bank.safetensors"), checkpoint_every=2, resume=True)
    with pytest.raises(Interrupted):  # after step 3: the state kept is step 2's
        tokmem.learn(
            tokmem.create(backbone, decoupled=True), examples, config(**settings, **checkpoint), on_step=interrupt_at(3)
        )
    assert (tmp_path / "bank.safetensors.train-state.pt").is_file()
    steps_after_resuming = []
    resumed_model = tokmem.create(backbone, decoupled=True)
    resumed = tokmem.learn(
        resumed_model,
        examples,
        config(**settings, **checkpoint),
        on_step=lambda done, _: steps_after_resuming.append(done),
    )
    assert steps_after_resuming[0] == 3 and resumed.steps == uninterrupted.steps == steps_after_resuming[-1]
    assert resumed.losses == pytest.approx(uninterrupted.losses, rel=1e-4)
    assert resumed.examples == uninterrupted.examples and resumed.tokens == uninterrupted.tokens
    for side in ("index", "steer"):
        torch.testing.assert_close(getattr(resumed_model.bank, side), getattr(uninterrupted_model.bank, side))


def test_resuming_refuses_a_state_another_training_saved(backbone, examples, tmp_path):
    checkpoint = dict(batch_size=2, checkpoint=str(tmp_path / "bank.safetensors"), checkpoint_every=1, resume=True)
    with pytest.raises(Interrupted):
        tokmem.learn(tokmem.create(backbone), examples, config(lr=0.05, **checkpoint), on_step=interrupt_at(1))
    with pytest.raises(TokMemError, match="bank.safetensors.train-state.pt was saved by another training"):
        tokmem.learn(tokmem.create(backbone), examples, config(lr=0.01, **checkpoint))


@pytest.mark.parametrize("checkpoint", [dict(), dict(checkpoint="bank.safetensors"), dict(checkpoint_every=1)])
def test_resuming_needs_checkpoints_to_resume_from(checkpoint):
    with pytest.raises(TokMemError, match="resume goes on from the checkpoints checkpoint_every saves to checkpoint"):
        config(resume=True, **checkpoint)


@pytest.mark.parametrize("frozen_rows", [0, 2])
def test_training_without_trainable_rows_is_refused(model, examples, backbone, frozen_rows):
    model.bank.add(["reverse", "upper"][:frozen_rows], backbone.mean_embedding())
    model.bank.freeze()
    with pytest.raises(TokMemError, match="no trainable rows"):
        tokmem.train(model, examples, config())


def test_a_round_with_no_new_procedure_is_refused_and_leaves_the_bank_alone(learned, examples):
    before = learned.bank.index.clone()
    with pytest.raises(TokMemError, match="nothing new to learn"):
        tokmem.learn(learned, examples, config())
    assert learned.bank.names == ["reverse", "upper"]
    assert torch.equal(learned.bank.index, before)


# ---- recipe options: row initialisation, schedule, per-step renormalisation ----------------------------------
def test_orthogonal_rows_are_orthogonal_at_the_embeddings_mean_norm(backbone):
    rows = initial_rows(backbone, list("abcde"), "orthogonal", seed=0)
    norm = backbone.embedding_norm()
    assert rows.shape == (5, backbone.hidden_size)
    assert torch.allclose(rows.norm(dim=1), torch.full((5,), norm), rtol=1e-4)
    gram = rows @ rows.T / norm**2
    assert torch.allclose(gram, torch.eye(5), atol=1e-4)


def test_mean_init_gives_every_new_row_the_mean_embedding(backbone):
    rows = initial_rows(backbone, ["a", "b", "c"], "mean")
    assert torch.equal(rows, backbone.mean_embedding().expand(3, -1))


def test_name_init_starts_each_row_at_its_own_texts_mean_embedding_at_a_tokens_norm(backbone):
    texts = row_texts(["get_weather", "convert_currency"], {"get_weather": "Current weather in a city."})
    assert texts == ["get weather: Current weather in a city.", "convert currency"]
    rows = initial_rows(backbone, texts, "name")
    assert torch.allclose(rows.norm(dim=1), torch.full((2,), backbone.embedding_norm()), rtol=1e-4)
    for row, text in zip(rows, texts):
        direction = backbone.text_embedding(text)
        assert torch.allclose(row / row.norm(), direction / direction.norm(), atol=1e-5)
    assert not torch.allclose(rows[0], rows[1])


def test_learn_starts_new_rows_from_their_catalog_text_when_asked(model, examples):
    seen = []
    descriptions = {"reverse": "Write the word backwards.", "upper": "Write the word in capitals."}
    tokmem.learn(
        model,
        examples,
        config(init="name", max_steps=1, lr=0.0),
        descriptions=descriptions,
        on_step=lambda step, total: seen.append(model.row_index.detach().clone()),
    )
    expected = initial_rows(model.backbone, row_texts(["reverse", "upper"], descriptions), "name")
    assert torch.allclose(seen[0], expected.to(seen[0].dtype), atol=1e-6)


def test_learn_starts_new_rows_orthogonal_when_asked(model, examples):
    seen = []
    tokmem.learn(
        model,
        examples,
        config(init="orthogonal", max_steps=1, lr=0.0),
        on_step=lambda step, total: seen.append(model.row_index.detach().clone()),
    )
    start = seen[0]  # lr 0: the rows are still their initial values
    assert abs(float(start[0] @ start[1])) < 1e-3 * float(start[0].norm() * start[1].norm())


def test_linear_schedule_warms_up_then_decays_to_zero():
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([parameter], lr=1.0)
    scheduler = lr_scheduler(optimizer, total_steps=10, schedule="linear", warmup=0.2)
    rates = []
    for _ in range(10):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates == pytest.approx([0.0, 0.5, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125])


def test_constant_schedule_keeps_the_learning_rate():
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=0.3)
    scheduler = lr_scheduler(optimizer, total_steps=4)
    for _ in range(4):
        optimizer.step()
        scheduler.step()
        assert optimizer.param_groups[0]["lr"] == 0.3


def test_per_step_renormalisation_keeps_new_rows_at_the_old_rows_mean_norm(learned, second_round):
    target = float(learned.bank.norms().mean())
    norms = []
    tokmem.learn(
        learned,
        second_round,
        config(epochs=2, lr=0.5, renorm_every_step=True),
        on_step=lambda step, total: norms.append(learned.row_index.detach().norm(dim=1)),
    )
    assert len(norms) > 1
    assert all(torch.allclose(n, torch.full_like(n, target), rtol=1e-5) for n in norms)


def test_a_first_round_renormalised_to_the_token_norm_keeps_its_rows_at_an_ordinary_tokens_norm(model, examples):
    norms = []
    report = tokmem.learn(
        model,
        examples,
        config(epochs=2, lr=0.5, renorm_every_step=True, renorm_target="tokens"),
        on_step=lambda step, total: norms.append(model.row_index.detach().norm(dim=1)),
    )
    token_norm = model.backbone.embedding_norm()
    assert report.renorm_target == pytest.approx(token_norm)
    assert all(torch.allclose(n, torch.full_like(n, token_norm), rtol=1e-5) for n in norms)
    assert torch.allclose(model.bank.norms(), torch.full((2,), token_norm), rtol=1e-5)


def test_a_decoupled_bank_renormalised_on_its_steer_side_holds_its_steer_rows_and_leaves_its_index_rows_free(
    backbone, examples
):
    model = tokmem.create(backbone, decoupled=True)
    steer_norms = []
    tokmem.learn(
        model,
        examples,
        config(epochs=2, lr=0.5, renorm_every_step=True, renorm_target="tokens", renorm_side="steer"),
        on_step=lambda step, total: steer_norms.append(model.row_steer.detach().norm(dim=1)),
    )
    token_norm = model.backbone.embedding_norm()
    assert all(torch.allclose(n, torch.full_like(n, token_norm), rtol=1e-5) for n in steer_norms)
    assert torch.allclose(model.bank.norms("steer"), torch.full((2,), token_norm), rtol=1e-5)
    assert not torch.allclose(model.bank.norms("index"), torch.full((2,), token_norm), rtol=1e-3)


def test_without_per_step_renormalisation_norms_drift_during_the_round(learned, second_round):
    target = float(learned.bank.norms().mean())
    norms = []
    tokmem.learn(
        learned,
        second_round,
        config(epochs=2, lr=0.5),
        on_step=lambda step, total: norms.append(learned.row_index.detach().norm(dim=1)),
    )
    assert not all(torch.allclose(n, torch.full_like(n, target), rtol=1e-3) for n in norms)


@pytest.mark.parametrize(
    "options", [{"init": "random"}, {"schedule": "cosine"}, {"warmup": 1.5}, {"renorm_side": "both"}]
)
def test_unknown_recipe_options_are_refused(options):
    with pytest.raises(TokMemError):
        TrainConfig(**options)


def test_learn_makes_procedures_answered_by_their_own_calls_tool_rows(model):
    calls = [
        Example(f"Weather in {c}?", (Step("weather", f'{{"name": "weather", "arguments": {{"city": "{c}"}}}}'),))
        for c in ("Oslo", "Rome")
    ]
    texts = [Example("Reverse sun.", (Step("reverse", "nus"),))]
    tokmem.learn(model, calls + texts, config(max_steps=1))
    assert dict(zip(model.bank.names, model.bank.kinds)) == {"weather": "tool", "reverse": "text"}


def test_tool_segments_call_keeps_every_row_text(model):
    calls = [Example("Weather in Oslo?", (Step("weather", '{"name": "weather", "arguments": {"city": "Oslo"}}'),))]
    tokmem.learn(model, calls, config(max_steps=1, tool_segments="call"))
    assert model.bank.kinds == ["text"]


def padding(order: list[int], lengths: list[int], batch_size: int) -> int:
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    return sum(max(lengths[i] for i in b) * len(b) - sum(lengths[i] for i in b) for b in batches)


def test_length_grouped_order_is_a_seeded_permutation_with_less_padding_than_a_shuffle():
    lengths = [int(x) for x in torch.randint(5, 200, (400,), generator=torch.Generator().manual_seed(0))]
    config = TrainConfig(batch_size=8, epochs=2, length_grouped=True)
    grouped = example_order(lengths, config)
    assert sorted(grouped[:400]) == sorted(grouped[400:]) == list(range(400))
    assert grouped == example_order(lengths, config)
    assert grouped[:400] != grouped[400:]  # each epoch its own order
    shuffled = example_order(lengths, TrainConfig(batch_size=8))
    assert padding(grouped[:400], lengths, 8) < 0.1 * padding(shuffled, lengths, 8)


def test_length_grouped_batches_do_not_come_sorted_by_length():
    lengths = list(range(400))
    order = example_order(lengths, TrainConfig(batch_size=8, length_grouped=True))
    firsts = [lengths[order[i]] for i in range(0, 400, 8)]
    assert firsts != sorted(firsts) and firsts != sorted(firsts, reverse=True)
