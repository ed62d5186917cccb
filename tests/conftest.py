"""Shared fixtures: the tiny-random backbone, a livelier copy of it, fresh models and small examples."""

import copy
import os

import pytest
import torch

import tokmem
from tokmem import Example, Step, load_backbone
from tokmem.backbones import PACKAGED, Backbone
from tokmem.errors import BackboneError

# CPU backbones load in float32 in tests, whatever the CPU (the tolerances are float32's, and a test of a trained
# model's quality must not hinge on a CPU's rounding); bf16 is tested explicitly
os.environ.setdefault("TOKMEM_CPU_BF16", "0")

WORDS = ["sun", "apple", "window", "blueberry"]  # different lengths, so batches carry unequal target counts


@pytest.fixture(scope="session")
def backbone():
    return load_backbone("tiny-random", device="cpu")


@pytest.fixture(scope="session")
def qwen():
    """The real qwen2.5-coder-0.5b where its packages are installed (``make qwen``); the test is skipped otherwise."""
    try:
        PACKAGED["qwen2.5-coder-0.5b"].part_paths()
    except BackboneError as err:
        pytest.skip(str(err))
    return load_backbone("qwen2.5-coder-0.5b", device="cpu")


@pytest.fixture(scope="session")
def qwen_tokenizer(qwen):
    return qwen.tokenizer


@pytest.fixture(scope="session")
def lively_backbone(backbone):
    """tiny-random with every weight matrix scaled by 20.

    tiny-random's greedy output is degenerate (it repeats the last token: its tied embeddings dominate
    the residual stream), so decoding comparisons on it would pass trivially.  Scaled up, attention and
    MLPs matter and the output depends on the whole context.  It also has a different fingerprint.
    """
    model = copy.deepcopy(backbone.model)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.ndim == 2:
                parameter.mul_(20)
    return Backbone("tiny-random-x20", model, backbone.tokenizer)


@pytest.fixture
def model(backbone):
    return tokmem.create(backbone)


@pytest.fixture
def examples():
    """Two atomic procedures on four words each, plus one chain."""
    reverse = [Example(f"Reverse {w}.", (Step("reverse", w[::-1]),), id=f"reverse-{w}") for w in WORDS]
    upper = [Example(f"Write {w} in capitals.", (Step("upper", w.upper()),), id=f"upper-{w}") for w in WORDS]
    chain = Example(
        "Reverse water, then capitalise it.", (Step("reverse", "retaw"), Step("upper", "RETAW")), id="chain"
    )
    return reverse + upper + [chain]


@pytest.fixture
def offline(lively_backbone, tmp_path):
    """The three served text banks written to ``tmp_path/banks``, as offline models (a server test's reference)."""
    from helpers import write_served_banks

    (tmp_path / "banks").mkdir()
    return write_served_banks(lively_backbone, tmp_path / "banks")
