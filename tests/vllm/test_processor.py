"""The logits processor on its own: vLLM's batch updates (add, swap, move, remove) keep each row's bank and state."""

import random
import types

import numpy as np
import pytest
import torch
from helpers import random_rows, write_bank

import tokmem
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

from tokmem.vllm import extra_args, slots
from tokmem.vllm.processor import TokMemLogitsProcessor

NEG = float("-inf")
SLOTS = 16


@pytest.fixture
def setup(vllm_backbone, tmp_path):
    """A processor over a fresh slot table, and three banks: a (2 rows, slots 0–1 once placed), b (3 rows) and c (2
    tools with a tail and a shared row each: 5 slots, rows first)."""
    vocab = vllm_backbone.vocab_size
    slots.install(slots.SlotTable(SLOTS, vllm_backbone.hidden_size, vocab))
    paths = {name: tmp_path / f"{name}.safetensors" for name in "abc"}
    for seed, (name, rows) in enumerate({"a": 2, "b": 3}.items()):
        write_bank(vllm_backbone, paths[name], rows=rows, seed=seed)
    context = tokmem.create(vllm_backbone, memory_tokens=2, shared_tokens=1)
    context.bank.add(["t0", "t1"], vllm_backbone.mean_embedding(), kinds=["tool", "tool"])
    random_rows(context.bank, seed=2)
    context.bank.save(paths["c"])
    config = types.SimpleNamespace(
        model_config=types.SimpleNamespace(
            get_vocab_size=lambda: vocab, hf_config=types.SimpleNamespace(eos_token_id=vllm_backbone.eos_token_id)
        )
    )
    return TokMemLogitsProcessor(config, torch.device("cpu"), False), paths, vocab


def v1_config(processor):
    """A vLLM config as far as the processor reads it (the one the fixture built)."""
    eos = processor.eos[0]
    return types.SimpleNamespace(
        model_config=types.SimpleNamespace(
            get_vocab_size=lambda: processor.vocab, hf_config=types.SimpleNamespace(eos_token_id=eos)
        )
    )


def allowed_slots(processor, vocab, rows: int) -> list[list[int]]:
    logits = processor.apply(torch.zeros(rows, vocab + SLOTS))
    return [(row[vocab:] > NEG).nonzero().flatten().tolist() for row in logits]


def test_rows_keep_their_banks_and_state_through_swaps_and_moves(setup):
    processor, paths, vocab = setup
    outputs = [[vocab + 0], [vocab + 3]]  # both routed already (a's row 0, b's row 1)
    added = [
        (i, SamplingParams(extra_args=extra_args(paths[name], max_steps=2)), None, outputs[i])
        for i, name in enumerate("ab")
    ]
    processor.update_state(BatchUpdate(2, [], added, []))
    assert allowed_slots(processor, vocab, 2) == [[0, 1], [2, 3, 4]]
    processor.update_state(BatchUpdate(2, [], [], [(0, 1, MoveDirectionality.SWAP)]))
    assert allowed_slots(processor, vocab, 2) == [[2, 3, 4], [0, 1]]
    outputs[0].append(vocab + 1)  # a (now row 1) reaches max_steps: no more memory tokens
    processor.update_state(BatchUpdate(1, [0], [], [(1, 0, MoveDirectionality.UNIDIRECTIONAL)]))
    assert allowed_slots(processor, vocab, 1) == [[]]
    placed = {p.rows: p.users for p in slots.current().placed.values()}
    assert placed == {2: 1, 3: 0}  # b's request left: its bank is no longer in use


def test_a_plain_first_token_blocks_memory_and_a_request_without_a_bank_never_gets_any(setup):
    processor, paths, vocab = setup
    outputs = [[5], []]
    added = [
        (0, SamplingParams(extra_args=extra_args(paths["a"])), None, outputs[0]),
        (1, SamplingParams(), None, outputs[1]),
    ]
    processor.update_state(BatchUpdate(2, [], added, []))
    assert allowed_slots(processor, vocab, 2) == [[], []]


def test_a_request_whose_bank_cannot_be_placed_may_only_end(setup, tmp_path, caplog):
    processor, paths, vocab = setup
    gone = tmp_path / "gone.safetensors"  # checked by the front end, deleted before the worker placed it
    processor.update_state(BatchUpdate(1, [], [(0, SamplingParams(extra_args=extra_args(gone)), None, [])], []))
    logits = processor.apply(torch.zeros(1, vocab + SLOTS))
    assert (logits[0] > NEG).nonzero().flatten().tolist() == [processor.eos[0]]
    assert "gone.safetensors" in caplog.text


def test_after_a_memory_token_its_tail_then_the_shared_row_are_forced_and_only_memory_tokens_count_as_steps(setup):
    processor, paths, vocab = setup
    output = [vocab + 1]  # c's row 1: its tail is slot 2 + 1, the shared row slot 4
    added = [(0, SamplingParams(extra_args=extra_args(paths["c"], max_steps=2)), None, output)]
    processor.update_state(BatchUpdate(1, [], added, []))
    for forced in (3, 4):
        logits = processor.apply(torch.zeros(1, vocab + SLOTS))
        assert (logits[0] > NEG).nonzero().flatten().tolist() == [vocab + forced]
        output.append(vocab + forced)
        processor.update_state(None)
    assert allowed_slots(processor, vocab, 1) == [[0, 1]]  # one call so far (max_steps 2): the rows route again
    output.append(vocab + 0)
    processor.update_state(None)
    assert allowed_slots(processor, vocab, 1) == [[2]]  # row 0's tail alone
    output.extend([vocab + 2, vocab + 4, 7])
    processor.update_state(None)
    assert allowed_slots(processor, vocab, 1) == [[]]  # two calls: max_steps reached


# ---- Model Runner V2: the same rules through its interface ---------------------------------------------------


def v2_processor(vocab: int, prompts: list[list[int]], outputs: list[list[int]]):
    """A V2 processor over request slots 0..n-1 holding ``prompts`` + ``outputs`` (as the runner's token buffer)."""
    width = max(len(p) + len(o) for p, o in zip(prompts, outputs)) + 1
    tokens = torch.zeros(len(prompts), width, dtype=torch.int32)
    for slot, (prompt, output) in enumerate(zip(prompts, outputs)):
        tokens[slot, : len(prompt) + len(output)] = torch.tensor(prompt + output)
    req_states = types.SimpleNamespace(
        all_token_ids=types.SimpleNamespace(gpu=tokens),
        prompt_len=types.SimpleNamespace(np=np.array([len(p) for p in prompts], dtype=np.int32)),
    )
    return req_states, tokens


def v2_context(req_states, tokens, order: list[int], lengths: list[int]):
    """The step's context for request slots in batch ``order``, each holding ``lengths[slot]`` tokens."""
    seq = np.array([lengths[slot] for slot in order], dtype=np.int32)
    return types.SimpleNamespace(
        idx_mapping=torch.tensor(order, dtype=torch.int32),  # as the runner keeps it
        idx_mapping_np=np.array(order),
        seq_lens_upper_bound_np=seq,
        input_ids=torch.stack([tokens[slot, lengths[slot] - 1] for slot in order]).long(),
    )


def test_both_model_runners_load_the_one_processor_name():
    from vllm.v1.sample.logits_processor import _load_custom_logitsprocs
    from vllm.v1.worker.gpu.sample.logits_processor.loader import _load_v2_logitsprocs_by_fqcns

    from tokmem.vllm.client import PROCESSOR

    assert _load_custom_logitsprocs([PROCESSOR]) == [TokMemLogitsProcessor]
    assert _load_v2_logitsprocs_by_fqcns([PROCESSOR]) == [TokMemLogitsProcessor]


@pytest.mark.parametrize("seed", range(10))
def test_model_runner_v2_masks_as_v1_does_for_the_same_requests_and_outputs(setup, seed):
    """Random requests (a bank or none, forced or not, max_steps 1–3) at random points of their answers, in a
    shuffled batch order: V2's logits equal V1's, element for element."""
    v1, paths, vocab = setup
    rng = random.Random(seed)
    requests, prompts, outputs = [], [], []
    for _ in range(10):
        bank = rng.choice([None, "a", "b", "c"])
        options = {} if bank is None else extra_args(paths[bank], threshold=rng.random(), max_steps=rng.randint(1, 3))
        if bank == "b" and rng.random() < 0.3:
            options = extra_args(paths["b"], procedure="p1")
        requests.append(SamplingParams(extra_args=options or None))
        prompts.append([rng.randrange(vocab) for _ in range(rng.randint(1, 4))])
        first = rng.choice([[], [vocab + rng.randrange(3)], [rng.randrange(vocab)]])
        more = rng.randint(0, 3) if first else 0
        outputs.append(first + [rng.choice([rng.randrange(vocab), vocab + rng.randrange(3)]) for _ in range(more)])
    requests[0], outputs[0] = SamplingParams(extra_args=extra_args(paths["a"], threshold=0.0)), []  # it routes
    order = rng.sample(range(len(requests)), len(requests))
    v1.update_state(BatchUpdate(len(order), [], [(i, requests[s], None, outputs[s]) for i, s in enumerate(order)], []))
    req_states, tokens = v2_processor(vocab, prompts, outputs)
    v2 = TokMemLogitsProcessor(v1_config(v1), req_states)
    assert all(v2.add_request(slot, params) for slot, params in enumerate(requests))
    logits = torch.randn(len(order), vocab + SLOTS, generator=torch.Generator().manual_seed(seed))
    lengths = [len(p) + len(o) for p, o in zip(prompts, outputs)]
    expected = v1.apply(logits.clone())
    assert torch.equal(v2.apply(logits.clone(), v2_context(req_states, tokens, order, lengths)), expected)
    assert (expected[:, vocab:] > NEG).any()  # some row may emit a memory token: the masks are not all empty


def test_model_runner_v2_releases_a_finished_requests_bank_when_its_slot_is_reused(setup):
    v1, paths, vocab = setup
    req_states, _ = v2_processor(vocab, [[1]], [[]])
    v2 = TokMemLogitsProcessor(v1_config(v1), req_states)
    v2.add_request(0, SamplingParams(extra_args=extra_args(paths["a"])))
    assert {p.rows: p.users for p in slots.current().placed.values()} == {2: 1}
    v2.add_request(0, SamplingParams())
    assert {p.rows: p.users for p in slots.current().placed.values()} == {2: 0}
