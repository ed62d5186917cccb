"""Integration on the real built-in backbone (smollm2-135m): learn, route, answer, add, save and reload.

These train for a few dozen steps on a 2-core CPU (about a minute each), so they are marked ``slow``;
``make test`` runs them, ``make test-fast`` skips them.
"""

import pytest
import torch

import tokmem
from tokmem import DecodeConfig, TrainConfig
from tokmem.bank.memory_bank import MemoryBank
from tokmem.data import builtin
from tokmem.eval.evaluate import evaluate

pytestmark = pytest.mark.slow

FIRST = ["quote_word", "first_number", "year_of_date"]
SECOND = ["percent", "comma_list"]
FEW_STEPS = TrainConfig(epochs=3, lr=2e-2, progress=False)


def dataset(names, seed=0):
    return builtin.demo_dataset(
        seed=seed, train_per_procedure=12, test_per_procedure=4, train_chains=0, test_chains=0, procedures=names
    )


@pytest.fixture(scope="module")
def smollm():
    return tokmem.load_backbone("smollm2-135m", device="cpu")


@pytest.fixture(scope="module")
def learned(smollm):
    """smollm2-135m after one round on three procedures (3 epochs of 36 queries: 27 steps).

    lr 2e-2: the paper's 5e-3 is meant for hundreds of examples per procedure; in 27 steps it barely
    moves the rows (measured: routing 1 in 3).
    """
    train, test = dataset(FIRST)
    model = tokmem.create(smollm)
    report = tokmem.learn(model, train, FEW_STEPS, descriptions=builtin.catalog())
    return model, report, test


def routing_accuracy(model, examples) -> float:
    routes = tokmem.route(model, [e.query for e in examples])
    return sum(r.best == e.procedures[0] for r, e in zip(routes, examples)) / len(examples)


def test_the_builtin_backbone_loads_frozen_from_its_local_cache(smollm):
    assert smollm.name == "smollm2-135m"
    assert all(not p.requires_grad for p in smollm.model.parameters())
    again = tokmem.load_backbone("smollm2-135m", device="cpu")
    assert again.fingerprint() == smollm.fingerprint()


def test_three_procedures_learned_in_a_few_dozen_steps_route_held_out_queries(learned):
    model, report, test = learned
    assert report.steps == 27
    assert sum(report.losses[-3:]) < sum(report.losses[:3])
    assert routing_accuracy(model, test) == 1.0


def test_learned_procedures_carry_most_of_the_probability_at_the_routing_position(learned):
    model, _, test = learned
    routes = tokmem.route(model, [e.query for e in test])
    assert min(r.memory_mass for r in routes) > 0.5
    plain = tokmem.route(model, ["What is the capital of France?"])[0]
    assert plain.memory_mass < min(r.memory_mass for r in routes)


def test_generation_routes_through_the_memory_token_and_returns_a_trace(learned):
    model, _, test = learned
    result = evaluate(model, test, DecodeConfig(max_new_tokens=24))
    assert result["routing_accuracy"] == 1.0 and result["open_set_fallbacks"] == 0
    assert all(p["trace"][0][0] == p["gold"][0] and p["answer"] for p in result["predictions"])


def test_a_second_round_keeps_old_rows_and_routes_old_and_new_procedures(learned):
    model, _, first_test = learned
    old_rows = model.bank.index.clone()
    train, test = dataset(SECOND, seed=1)
    tokmem.learn(model, train, FEW_STEPS)
    assert set(model.bank.names[: len(FIRST)]) == set(FIRST) and set(model.bank.names[len(FIRST) :]) == set(SECOND)
    assert torch.equal(model.bank.index[: len(FIRST)], old_rows)
    norms = model.bank.index.norm(dim=-1)
    assert torch.allclose(norms[len(FIRST) :], norms[: len(FIRST)].mean().expand(len(SECOND)), rtol=1e-4)
    assert routing_accuracy(model, test) == 1.0
    assert routing_accuracy(model, first_test) >= 0.9


def test_a_saved_bank_reloads_with_its_backbone_and_routes_identically(learned, smollm, tmp_path):
    model, _, test = learned
    path = tmp_path / "bank.safetensors"
    model.bank.save(path)
    reloaded = tokmem.load(path, backbone=smollm)
    assert torch.equal(reloaded.bank.index, model.bank.index)
    queries = [e.query for e in test]
    assert [r.candidates for r in tokmem.route(reloaded, queries)] == [
        r.candidates for r in tokmem.route(model, queries)
    ]
    assert MemoryBank.load(path, backbone=smollm).names == model.bank.names
