"""The server's engine and bank registry: continuous batching over rows of different banks.

The engine is driven step by step here (no thread), so requests join and leave the running batch at
chosen steps.  Runs on the livelier tiny-random (see conftest), where outputs depend on the whole context.
"""

import pytest
import torch
from helpers import QUERIES, SERVED_BANKS, bank_files, write_bank, write_served_banks

import tokmem
from tokmem import DecodeConfig
from tokmem.errors import BankError
from tokmem.training.sequences import chat_prefix
from tokmem.serve.banks import BankNotFound, BankRegistry, BankVersion
from tokmem.serve.engine import Engine, Overloaded, Request, bank_tables


@pytest.fixture
def offline(lively_backbone, tmp_path):
    return write_served_banks(lively_backbone, tmp_path)


@pytest.fixture
def registry(lively_backbone, tmp_path, offline):
    return BankRegistry(lively_backbone, tmp_path)


def request(registry, bank, query, **options) -> Request:
    return Request(registry.get(bank), chat_prefix(registry.backbone.tokenizer, query), query, **options)


def pairs(generation) -> list[tuple]:
    return [(s.procedure, s.text) for s in generation.trace]


def run(engine, *handles):
    while engine.step():
        pass
    assert all(h.finished for h in handles)


def test_bank_tables_give_each_row_its_own_bank_padded_to_the_widest(registry):
    banks = [registry.get(n) for n in ("beta", "alpha", "beta", "empty", "gamma")]
    index, steer, valid = bank_tables(banks, "cpu")
    assert index.shape == steer.shape == (5, 4, registry.backbone.hidden_size)
    assert valid.sum(-1).tolist() == [4, 3, 4, 0, 1]
    for row, bank in enumerate(banks):
        assert torch.equal(index[row, : bank.rows], bank.index) and torch.equal(steer[row, : bank.rows], bank.steer)
    assert not torch.equal(banks[0].index, banks[0].steer)  # beta is decoupled: its two sides differ


def test_greedy_answers_equal_generate_while_rows_of_other_banks_join_and_leave(registry, offline):
    """Every bank form in one batch, requests arriving at different steps, more of them than the batch holds."""
    engine = Engine(registry.backbone, max_batch=3)
    jobs = [(bank, query, threshold) for threshold in (0.0, 0.5) for bank in SERVED_BANKS for query in QUERIES[:2]]
    jobs += [("alpha", QUERIES[2], 0.0), ("beta", QUERIES[3], 0.0)]
    handles = []
    for bank, query, threshold in jobs:
        handles.append(engine.submit(request(registry, bank, query, max_tokens=12, threshold=threshold, max_steps=3)))
        engine.step()
    run(engine, *handles)
    offline_answers = {}  # offline, the queries of one bank and threshold go in one batch
    for bank, _, threshold in jobs:
        config = DecodeConfig(max_new_tokens=12, threshold=threshold, max_steps=3)
        offline_answers[bank, threshold] = dict(zip(QUERIES[:4], tokmem.generate(offline[bank], QUERIES[:4], config)))
    routed = 0
    for (bank, query, threshold), handle in zip(jobs, handles):
        expected, answer = offline_answers[bank, threshold][query], handle.generation()
        assert pairs(answer) == pairs(expected), (bank, query, threshold)
        assert answer.memory_mass == pytest.approx(expected.memory_mass, abs=1e-5)
        routed += answer.routed
    assert 0 < routed < len(jobs)  # both routed and open-set answers were compared
    assert len({handle.generation().text for handle in handles}) > len(jobs) // 2


def test_forced_procedures_and_step_limits_follow_generate(registry, offline):
    engine = Engine(registry.backbone)
    model = offline["beta"]
    jobs = [
        dict(forced=model.memory_id("p2"), max_steps=1),
        dict(forced=model.memory_id("p0"), max_steps=2),
        dict(max_steps=1, threshold=0.0),
    ]
    handles = [engine.submit(request(registry, "beta", QUERIES[0], max_tokens=16, **job)) for job in jobs]
    run(engine, *handles)
    for job, handle in zip(jobs, handles):
        procedure = None if "forced" not in job else model.bank.names[job["forced"] - model.vocab_size]
        config = DecodeConfig(max_new_tokens=16, max_steps=job["max_steps"], threshold=job.get("threshold", 0.5))
        assert pairs(handle.generation()) == pairs(tokmem.generate(model, [QUERIES[0]], config, procedure=procedure)[0])
        assert len(handle.generation().procedures) <= job["max_steps"]


def test_a_running_request_finishes_on_the_bank_version_it_started_with(registry, offline, lively_backbone, tmp_path):
    engine = Engine(registry.backbone)
    old = engine.submit(request(registry, "alpha", QUERIES[0], max_tokens=12, threshold=0.0))
    engine.step()
    replacement = write_bank(lively_backbone, tmp_path / "upload" / "alpha.safetensors", rows=2, seed=9)
    registry.put("alpha", *bank_files(tmp_path / "upload" / "alpha.safetensors"))
    new = engine.submit(request(registry, "alpha", QUERIES[0], max_tokens=12, threshold=0.0))
    run(engine, old, new)
    config = DecodeConfig(max_new_tokens=12, threshold=0.0)
    assert pairs(old.generation()) == pairs(tokmem.generate(offline["alpha"], [QUERIES[0]], config)[0])
    assert pairs(new.generation()) == pairs(tokmem.generate(replacement, [QUERIES[0]], config)[0])
    assert old.request.bank.revision != new.request.bank.revision


def test_rows_leave_when_done_cancelled_or_timed_out_and_unused_cache_columns_are_cut(registry):
    engine = Engine(registry.backbone)
    long_prompt = engine.submit(
        request(registry, "alpha", "a much longer query than the others " * 3, max_tokens=40, ignore_eos=True)
    )
    short = engine.submit(request(registry, "gamma", "hi", max_tokens=40, ignore_eos=True))
    timed = engine.submit(request(registry, "beta", "hi", max_tokens=40, ignore_eos=True, timeout=0.0))
    engine.step()
    assert timed.finish_reason == "timeout" and engine.running == 2
    width = engine.batch.rows.mask.shape[1]
    long_prompt.cancel()
    engine.step()
    assert long_prompt.finish_reason == "cancelled" and engine.running == 1
    mask = engine.batch.rows.mask
    assert mask.shape[1] < width - 20 and mask.all()  # the long prompt's columns are gone
    run(engine, short)
    assert short.finish_reason == "length" and len(short.tokens) == 40 and engine.batch is None


def test_queued_requests_time_out_or_cancel_without_waiting_for_a_free_row(registry):
    engine = Engine(registry.backbone, max_batch=1)
    running = engine.submit(request(registry, "alpha", "hi", max_tokens=40, ignore_eos=True))
    late = engine.submit(request(registry, "beta", "hi", timeout=0.0))
    gone = engine.submit(request(registry, "beta", "hi"))
    gone.cancel()
    engine.step()
    assert (late.finish_reason, gone.finish_reason) == ("timeout", "cancelled") and not engine.pending
    assert not running.finished and engine.running == 1


def test_a_full_queue_refuses_new_requests(registry):
    engine = Engine(registry.backbone, max_queue=1)
    engine.submit(request(registry, "alpha", "hi"))
    with pytest.raises(Overloaded, match="busy"):
        engine.submit(request(registry, "alpha", "hi"))


def test_the_engine_thread_answers_submitted_requests(registry, offline):
    engine = Engine(registry.backbone)
    engine.start()
    try:
        handle = engine.submit(request(registry, "gamma", QUERIES[1], max_tokens=8, threshold=0.0))
        assert handle.wait(timeout=60)
    finally:
        engine.stop()
    expected = tokmem.generate(offline["gamma"], [QUERIES[1]], DecodeConfig(max_new_tokens=8, threshold=0.0))[0]
    assert pairs(handle.generation()) == pairs(expected)


# ---- the registry -------------------------------------------------------------------------------
def test_banks_load_lazily_and_the_least_recently_used_leave(lively_backbone, tmp_path, offline):
    registry = BankRegistry(lively_backbone, tmp_path, max_resident=2)
    assert registry.names() == sorted(SERVED_BANKS) and registry.resident == 0
    alpha = registry.get("alpha")
    assert registry.get("alpha") is alpha
    registry.get("beta")
    registry.get("alpha")
    registry.get("gamma")  # beta was used least recently
    assert registry.resident == 2 and registry.get("alpha") is alpha
    again = registry.get("beta")
    assert again is not alpha and again.revision == registry.get("beta").revision
    assert torch.equal(again.index, offline["beta"].bank.index)
    with pytest.raises(BankNotFound, match="no bank named 'delta'"):
        registry.get("delta")


@pytest.mark.parametrize("name", ["../alpha", "a/b", "..", "a..b", ".hidden", "x" * 65, "", "sp ace"])
def test_bank_names_with_path_parts_or_odd_characters_are_refused(registry, name):
    with pytest.raises(BankError, match="invalid bank name"):
        registry.get(name)


def test_a_deleted_bank_is_gone_but_a_version_in_use_stays_usable(registry, tmp_path):
    version = registry.get("gamma")
    registry.delete("gamma")
    assert "gamma" not in registry.names() and not list(tmp_path.glob("gamma*"))
    with pytest.raises(BankNotFound):
        registry.get("gamma")
    assert version.rows == 1 and version.model.bank.names == ["p0"]


# ---- failure isolation ----------------------------------------------------------------------------
def clean_jobs(registry):
    """Requests that must get their offline answers whatever else is in the batch."""
    return [("alpha", QUERIES[0]), ("beta", QUERIES[1]), ("gamma", QUERIES[2])]


def assert_offline_answers(offline, jobs, handles):
    for (bank, query), handle in zip(jobs, handles):
        expected = tokmem.generate(offline[bank], [query], DecodeConfig(max_new_tokens=10, threshold=0.0))[0]
        assert handle.finish_reason in ("stop", "length") and pairs(handle.generation()) == pairs(expected), (
            bank,
            query,
        )


def huge_bank(registry, name="alpha", value=3e38):
    """A version of ``name`` whose rows are finite but so large that the logits overflow (what validation now refuses)."""
    version = registry.get(name)
    index = torch.full_like(version.index, value)
    return BankVersion(version.name, "huge", version.model, index, index, version.stamp, version.grammars)


@pytest.mark.parametrize(
    "poison",
    [
        dict(max_steps=2**63),  # cannot become a tensor: the prefill fails
        dict(temperature=1e-45),  # sampled at a tiny temperature: must not overflow
    ],
    ids=["max-steps-overflow", "tiny-temperature"],
)
def test_a_request_that_cannot_be_prefilled_or_sampled_fails_alone_and_the_batch_answers_exactly(
    registry, offline, poison
):
    engine = Engine(registry.backbone)
    jobs = clean_jobs(registry)
    running = engine.submit(request(registry, *jobs[0], max_tokens=10, threshold=0.0))
    engine.step()  # one request already running when the poison arrives with the others
    bad = engine.submit(request(registry, "alpha", QUERIES[3], max_tokens=10, **poison))
    others = [engine.submit(request(registry, bank, query, max_tokens=10, threshold=0.0)) for bank, query in jobs[1:]]
    run(engine, running, bad, *others)
    assert_offline_answers(offline, jobs, [running, *others])
    if "max_steps" in poison:
        assert bad.finish_reason == "error" and "could not be prefilled" in bad.error
    else:
        assert bad.finish_reason in ("stop", "length") and bad.tokens


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_a_row_whose_logits_overflow_fails_alone(registry, offline, temperature):
    engine = Engine(registry.backbone)
    jobs = clean_jobs(registry)
    handles = [engine.submit(request(registry, bank, query, max_tokens=10, threshold=0.0)) for bank, query in jobs]
    poison = Request(
        huge_bank(registry),
        chat_prefix(registry.backbone.tokenizer, "hi"),
        "hi",
        max_tokens=10,
        temperature=temperature,
    )
    bad = engine.submit(poison)
    run(engine, bad, *handles)
    assert bad.finish_reason == "error" and "NaN/inf" in bad.error
    assert_offline_answers(offline, jobs, handles)


def test_stop_finishes_every_queued_and_running_request(registry):
    engine = Engine(registry.backbone)
    running = engine.submit(request(registry, "alpha", "hi", max_tokens=40, ignore_eos=True))
    engine.step()
    queued = engine.submit(request(registry, "beta", "hi"))
    engine.stop()
    assert running.finish_reason == queued.finish_reason == "error" and "shutting down" in queued.error
    assert engine.batch is None and not engine.pending


def test_the_engine_thread_survives_a_failed_step_and_finishes_the_requests_being_admitted(
    registry, offline, monkeypatch
):
    """A failure of the shared step (here: joining the new rows to the running batch) ends every request with
    an error, including those that had left the queue; the thread goes on and answers the next request."""
    engine = Engine(registry.backbone)
    running = engine.submit(request(registry, "alpha", "hi", max_tokens=40, ignore_eos=True))
    engine.step()

    def broken_join(self, other):
        raise RuntimeError("out of memory")

    monkeypatch.setattr("tokmem.serve.engine._Batch.join", broken_join)
    joining = engine.submit(request(registry, "beta", "hi"))
    engine.start()
    try:
        assert joining.wait(timeout=60) and running.wait(timeout=60)
        assert (running.finish_reason, joining.finish_reason) == (
            "error",
            "error",
        ) and "decoding step failed" in joining.error
        later = engine.submit(request(registry, "gamma", QUERIES[1], max_tokens=10, threshold=0.0))
        assert later.wait(timeout=60)
    finally:
        engine.stop()
    assert_offline_answers(offline, [("gamma", QUERIES[1])], [later])
