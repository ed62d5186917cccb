"""Where a result was measured: the machine every result file records."""

import os

import torch

from tokmem.report import machine, outcome_lines


def test_the_machine_gives_its_cores_and_torchs_threads_apart():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        recorded = machine()
    finally:
        torch.set_num_threads(threads)
    assert recorded["cpus"] == os.cpu_count() and recorded["threads"] == 1


def test_the_machine_says_which_dtype_a_cpu_backbone_loads_in_and_why(monkeypatch):
    monkeypatch.setenv("TOKMEM_CPU_BF16", "0")
    assert machine()["cpu_dtype"].startswith("CPU backbones load in float32: decided by $TOKMEM_CPU_BF16=0")


def test_the_outcome_lines_name_the_keys_wrong_key_sets_left_out_and_added_only_when_there_are_some():
    steps = {"exact": 3, "wrong key set": 2}
    keys = {"left out": {"sort": 2}, "added": {"adults": 1}}
    assert outcome_lines({"steps": steps, "wrong key sets, by key": keys}) == [
        "per-step answers: exact 3, wrong key set 2",
        "wrong key sets: left out sort (2); added adults (1)",
    ]
    none = {"left out": {}, "added": {}}
    assert outcome_lines({"steps": {"exact": 5}, "wrong key sets, by key": none}) == ["per-step answers: exact 5"]
