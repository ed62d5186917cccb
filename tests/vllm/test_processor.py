"""The logits processor on its own: vLLM's batch updates (add, swap, move, remove) keep each row's bank and state."""

import types

import pytest
import torch
from helpers import write_bank
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

from tokmem.vllm import extra_args, slots
from tokmem.vllm.processor import TokMemLogitsProcessor

NEG = float("-inf")


@pytest.fixture
def setup(vllm_backbone, tmp_path):
    """A processor over a fresh slot table, and two banks: a (2 rows, slots 0–1 once placed) and b (3 rows)."""
    vocab = vllm_backbone.vocab_size
    slots.install(slots.SlotTable(8, vllm_backbone.hidden_size, vocab))
    paths = {name: tmp_path / f"{name}.safetensors" for name in "ab"}
    for seed, (name, rows) in enumerate({"a": 2, "b": 3}.items()):
        write_bank(vllm_backbone, paths[name], rows=rows, seed=seed)
    config = types.SimpleNamespace(
        model_config=types.SimpleNamespace(
            get_vocab_size=lambda: vocab, hf_config=types.SimpleNamespace(eos_token_id=vllm_backbone.eos_token_id)
        )
    )
    return TokMemLogitsProcessor(config, torch.device("cpu"), False), paths, vocab


def allowed_slots(processor, vocab, rows: int) -> list[list[int]]:
    logits = processor.apply(torch.zeros(rows, vocab + 8))
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
    logits = processor.apply(torch.zeros(1, vocab + 8))
    assert (logits[0] > NEG).nonzero().flatten().tolist() == [processor.eos[0]]
    assert "gone.safetensors" in caplog.text
