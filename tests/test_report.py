"""Where a result was measured: the machine every result file records."""

import os

import torch

from tokmem.report import machine


def test_the_machine_gives_its_cores_and_torchs_threads_apart():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        recorded = machine()
    finally:
        torch.set_num_threads(threads)
    assert recorded["cpus"] == os.cpu_count() and recorded["threads"] == 1
