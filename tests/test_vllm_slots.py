"""The vLLM plugin's parts that need no vLLM: the slot table (bank registry), request options, client helpers."""

import os

import pytest
import torch
from helpers import write_bank

from tokmem.decoding.decode import DecodeConfig
from tokmem.vllm import cache_salt, engine_args, extra_args
from tokmem.vllm.options import OptionError, Options
from tokmem.vllm.slots import SlotsFull, SlotTable


@pytest.fixture
def banks(backbone, tmp_path):
    """name -> (path, model) for banks of 3, 2 and 4 rows."""
    return {
        name: (tmp_path / f"{name}.safetensors", write_bank(backbone, tmp_path / f"{name}.safetensors", rows, seed=i))
        for i, (name, rows) in enumerate({"a": 3, "b": 2, "c": 4}.items())
    }


def table(backbone, slots: int) -> SlotTable:
    return SlotTable(slots, backbone.hidden_size, backbone.vocab_size)


def test_banks_take_consecutive_slots_holding_their_rows(backbone, banks):
    slots = table(backbone, 8)
    a, b = slots.acquire(banks["a"][0]), slots.acquire(banks["b"][0])
    assert (a.offset, b.offset) == (0, 3)
    assert torch.equal(slots.index[3:5], banks["b"][1].bank.index)
    assert torch.equal(slots.steer[3:5], banks["b"][1].bank.steer_matrix)
    assert slots.acquire(banks["a"][0]) is a and a.users == 2  # placed once, used twice


def test_the_least_recently_used_unused_bank_leaves_when_the_slots_run_out(backbone, banks):
    slots = table(backbone, 7)
    b, a = slots.acquire(banks["b"][0]), slots.acquire(banks["a"][0])  # b in 0–1, a in 2–4
    slots.release(a)
    slots.release(b)
    slots.acquire(banks["b"][0])  # b is now the more recent
    slots.release(b)
    c = slots.acquire(banks["c"][0])  # 4 rows: they fit once a leaves (2–6), and b may stay
    assert c.offset == 2
    assert [p.bank.names for p in slots.placed.values()] == [banks["b"][1].bank.names, banks["c"][1].bank.names]


def test_banks_in_use_never_leave_and_a_full_table_says_what_to_do(backbone, banks):
    slots = table(backbone, 6)
    slots.acquire(banks["a"][0])
    with pytest.raises(SlotsFull, match="tokmem_slots"):
        slots.acquire(banks["c"][0])
    assert len(slots.placed) == 1


def test_a_bank_rewritten_in_place_is_placed_again_as_a_new_revision(backbone, banks):
    slots = table(backbone, 16)
    path, _ = banks["a"]
    first = slots.acquire(path)
    model = write_bank(backbone, path, rows=3, seed=7)
    os.utime(path, ns=(0, os.stat(path).st_mtime_ns + 1))  # a new revision even within the clock's resolution
    second = slots.acquire(path)
    assert second is not first
    assert torch.equal(slots.index[second.offset : second.end], model.bank.index)


def test_a_bank_of_another_width_is_refused(backbone, banks):
    slots = SlotTable(4, backbone.hidden_size + 1, backbone.vocab_size)
    with pytest.raises(Exception, match="width"):
        slots.acquire(banks["b"][0])


def test_options_default_to_decode_configs_and_a_request_without_a_bank_has_none():
    options = Options.from_extra_args(extra_args("bank.safetensors"))
    assert (options.threshold, options.max_steps, options.procedure) == (
        DecodeConfig.threshold,
        DecodeConfig.max_steps,
        None,
    )
    assert Options.from_extra_args(None) is None
    assert Options.from_extra_args({"other": 1}) is None


@pytest.mark.parametrize(
    "args, field",
    [
        ({"tokmem_bank": "b", "tokmem_threshold": 1.5}, "tokmem_threshold"),
        ({"tokmem_bank": "b", "tokmem_threshold": "high"}, "tokmem_threshold"),
        ({"tokmem_bank": "b", "tokmem_max_steps": 0}, "tokmem_max_steps"),
        ({"tokmem_bank": "b", "tokmem_max_steps": True}, "tokmem_max_steps"),
        ({"tokmem_bank": 3}, "tokmem_bank"),
        ({"tokmem_threshold": 0.2}, "without tokmem_bank"),
    ],
)
def test_bad_options_are_refused_naming_their_field(args, field):
    with pytest.raises(OptionError, match=field):
        Options.from_extra_args(args)


def test_the_bank_check_names_a_missing_file_and_an_unknown_procedure(banks):
    with pytest.raises(OptionError, match="missing.safetensors"):
        Options("missing.safetensors").check_bank()
    with pytest.raises(ValueError, match="nope"):
        Options(str(banks["a"][0]), procedure="nope").check_bank()


def test_the_cache_salt_changes_with_the_banks_contents(backbone, banks):
    path, _ = banks["a"]
    before = cache_salt(path)
    assert before == cache_salt(path)
    write_bank(backbone, path, rows=3, seed=9)
    assert cache_salt(path) != before


def test_engine_args_name_the_architecture_slots_and_processor():
    args = engine_args("qwen2", slots=64)
    assert args["hf_overrides"] == {"architectures": ["TokMemQwen2ForCausalLM"], "tokmem_slots": 64}
    assert args["logits_processors"] == ["tokmem.vllm.processor:TokMemLogitsProcessor"]
    with pytest.raises(ValueError, match="llama, qwen2"):
        engine_args("gpt2")
