"""The adaptation phase: LoRA merged into a copy of the backbone, temporary rows dropped, identity recorded."""

import copy
import importlib
import json
import re
import shlex
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers import Interrupted, interrupt_at
from peft import PeftModel
from peft.tuners.tuners_utils import BaseTunerLayer

import tokmem
from tokmem import TrainConfig, load_backbone
from tokmem.training.adapt import AdaptConfig, adapt, adaptation_key, cached_adapt, save_backbone
from tokmem.backbones import Backbone
from tokmem.bank.memory_bank import MemoryBank
from tokmem.cli import build_parser, main
from tokmem.cli.learn import adapt_settings
from tokmem.data.tool_catalog import split_tools
from tokmem.data.tool_chains import TOOLS as TOOL_CHAIN_TOOLS
from tokmem.data.tool_datasets import tool_examples
from tokmem.errors import BackboneError, BankError
from research.studies.compositional_config import QWEN_05B, make_config
from research.studies.tool_setup import adaptation_rows

QV = ("q_proj", "v_proj")
FAST = AdaptConfig(lr=1e-2)


def options(**extra) -> TrainConfig:
    return TrainConfig(**{"progress": False, **extra})


@pytest.fixture(scope="module")
def adaptation_examples():
    return tool_examples(split_tools()[0][:3], n_single=1, n_multi=3, seed=0)


@pytest.fixture(scope="module")
def base_state(backbone):
    return {k: v.clone() for k, v in backbone.model.state_dict().items()}


@pytest.fixture(scope="module")
def callers_model(backbone, adaptation_examples):
    """A model the caller trained on the base backbone before adapting it, and a snapshot of its bank."""
    model = tokmem.create(backbone)
    tokmem.learn(model, adaptation_examples, options())
    return model, (list(model.bank.names), model.bank.index.clone(), dict(model.bank.backbone))


@pytest.fixture(scope="module")
def adapted(backbone, base_state, callers_model, adaptation_examples, tmp_path_factory):
    """The tiny backbone adapted and saved to a directory (after ``base_state`` and ``callers_model``)."""
    return adapt(backbone, adaptation_examples, FAST, options(), save_to=tmp_path_factory.mktemp("adapted") / "model")


def changed_weights(model, reference) -> set[str]:
    state = model.state_dict()
    assert state.keys() == reference.keys()
    return {name for name in state if not torch.equal(state[name], reference[name])}


def projection_weights(model, modules) -> set[str]:
    return {name for name in model.state_dict() if name.rsplit(".", 2)[-2] in modules}


def test_adaptation_merges_lora_into_the_query_and_value_weights_only(adapted, base_state):
    changed = changed_weights(adapted.model, base_state)
    assert changed == projection_weights(adapted.model, QV)
    assert len(changed) == 2 * adapted.model.config.num_hidden_layers


def test_the_adapted_backbone_is_a_frozen_plain_transformers_model(adapted, backbone):
    model = adapted.model
    assert type(model) is type(backbone.model) and not isinstance(model, PeftModel)
    assert not any(p.requires_grad for p in model.parameters())
    assert not any(isinstance(m, BaseTunerLayer) or "lora" in name for name, m in model.named_modules())
    assert not hasattr(model, "peft_config") and not model.training


def test_adaptation_leaves_the_given_backbone_and_its_banks_untouched(adapted, backbone, base_state, callers_model):
    model, (names, index, identity) = callers_model
    assert not changed_weights(backbone.model, base_state)
    assert backbone.fingerprint() == identity["fingerprint"] != adapted.fingerprint()
    assert not any(p.requires_grad for p in backbone.model.parameters())
    assert (model.bank.names, model.bank.backbone) == (names, identity)
    assert torch.equal(model.bank.index, index)


def test_the_temporary_rows_are_discarded(adapted, backbone):
    assert len(tokmem.create(adapted).bank) == 0
    assert adapted.vocab_size == backbone.vocab_size
    assert adapted.model.get_input_embeddings().weight.shape == backbone.model.get_input_embeddings().weight.shape


def test_a_bank_trained_on_the_adapted_backbone_records_its_identity(adapted, backbone, adaptation_examples, tmp_path):
    assert adapted.fingerprint() != backbone.fingerprint()
    model = tokmem.create(adapted)
    tokmem.learn(model, adaptation_examples[:4], options())
    assert model.bank.backbone == {"name": adapted.name, "fingerprint": adapted.fingerprint()}
    path = model.bank.save(tmp_path / "bank.safetensors")
    with pytest.raises(BankError, match="not for 'tiny-random'"):
        MemoryBank.load(path, backbone=backbone)
    reloaded = tokmem.load(path)  # finds the adapted backbone by the directory the bank names
    assert reloaded.backbone.fingerprint() == adapted.fingerprint()
    assert torch.equal(reloaded.bank.index, model.bank.index)


def test_the_saved_adapted_backbone_reloads_with_the_same_fingerprint_and_weights(adapted):
    reloaded = load_backbone(adapted.name, device="cpu")
    assert reloaded.fingerprint() == adapted.fingerprint()
    assert not changed_weights(reloaded.model, adapted.model.state_dict())


def test_saving_refuses_an_existing_directory(adapted, tmp_path):
    with pytest.raises(BackboneError, match="already exists"):
        save_backbone(adapted, tmp_path)


def test_adaptation_is_seeded(backbone, adaptation_examples, adapted, base_state):
    """The same seed gives the same weights (up to CPU float noise, which the exact identity still tells apart)."""
    again = adapt(backbone, adaptation_examples, FAST, options())
    state, reference = again.model.state_dict(), adapted.model.state_dict()
    for name in projection_weights(again.model, QV):
        delta = (reference[name] - base_state[name]).abs().max()
        assert torch.allclose(state[name], reference[name], rtol=0, atol=1e-3 * float(delta))


def test_lora_targets_are_configurable(backbone, base_state, adaptation_examples):
    config = AdaptConfig(rank=2, target_modules=("k_proj", "o_proj"), lr=1e-2)
    adapted = adapt(backbone, adaptation_examples[:4], config, options())
    assert changed_weights(adapted.model, base_state) == projection_weights(adapted.model, ("k_proj", "o_proj"))


def test_an_unknown_lora_target_is_a_backbone_error(backbone, adaptation_examples):
    with pytest.raises(BackboneError, match="no_such_proj"):
        adapt(backbone, adaptation_examples, AdaptConfig(target_modules=("no_such_proj",)), options())


def test_inplace_adaptation_merges_into_the_given_model(backbone, base_state, adaptation_examples):
    own = Backbone("tiny-copy", copy.deepcopy(backbone.model), backbone.tokenizer)
    adapted = adapt(own, adaptation_examples[:4], FAST, options(), inplace=True)
    assert adapted.model is own.model
    assert changed_weights(own.model, base_state) == projection_weights(own.model, QV)
    assert own.fingerprint() == adapted.fingerprint() != backbone.fingerprint()


# ---- the adaptation as a cached artefact ----------------------------------------------------------------------
def test_the_second_cached_adaptation_with_the_same_inputs_loads_the_first(backbone, adaptation_examples, tmp_path):
    first, directory, cached = cached_adapt(backbone, adaptation_examples, FAST, options(max_steps=2), tmp_path)
    assert not cached and directory.parent == tmp_path and directory.is_dir()
    again, same_directory, cached = cached_adapt(backbone, adaptation_examples, FAST, options(max_steps=2), tmp_path)
    assert cached and same_directory == directory
    assert again.fingerprint() == first.fingerprint() != backbone.fingerprint()


def test_an_interrupted_adaptation_resumed_from_its_checkpoint_merges_the_uninterrupted_weights(
    backbone, adaptation_examples, tmp_path
):
    rows = options(batch_size=1, checkpoint=str(tmp_path / "phase.safetensors"), checkpoint_every=2, resume=True)
    whole = adapt(backbone, adaptation_examples, FAST, options(batch_size=1))
    with pytest.raises(Interrupted):  # after step 3: the state kept is step 2's
        adapt(backbone, adaptation_examples, FAST, rows, on_step=interrupt_at(3))
    assert (tmp_path / "phase.safetensors.train-state.pt").is_file()
    steps = []
    resumed = adapt(backbone, adaptation_examples, FAST, rows, on_step=lambda done, _: steps.append(done))
    assert steps[0] == 3 and len(steps) > 1
    torch.testing.assert_close(resumed.model.state_dict(), whole.model.state_dict())
    assert resumed.fingerprint() == whole.fingerprint()
    assert list(tmp_path.iterdir()) == []  # the checkpoint goes once the adaptation is merged


def test_a_cached_adaptation_interrupted_goes_on_from_its_checkpoint_at_the_next_call(
    backbone, adaptation_examples, tmp_path, monkeypatch
):
    monkeypatch.setattr(importlib.import_module("tokmem.training.adapt"), "CACHE_CHECKPOINT_EVERY", 1)
    rows = options(batch_size=1)
    whole, _, _ = cached_adapt(backbone, adaptation_examples, FAST, rows, tmp_path / "whole")
    with pytest.raises(Interrupted):
        cached_adapt(backbone, adaptation_examples, FAST, rows, tmp_path / "cut", on_step=interrupt_at(2))
    key = adaptation_key(backbone, adaptation_examples, FAST, rows)
    assert sorted(p.name for p in (tmp_path / "cut").iterdir()) == [
        f"{key}.checkpoint.safetensors{end}" for end in ("", ".json", ".train-state.pt")
    ]
    steps = []
    resumed, directory, cached = cached_adapt(
        backbone, adaptation_examples, FAST, rows, tmp_path / "cut", on_step=lambda done, _: steps.append(done)
    )
    assert not cached and steps[0] == 3
    assert resumed.fingerprint() == whole.fingerprint()
    assert directory.name == key and [p.name for p in (tmp_path / "cut").iterdir()] == [key]


@pytest.mark.parametrize(
    "change",
    [
        lambda examples, config, rows: (examples[:-1], config, rows),
        lambda examples, config, rows: (examples, AdaptConfig(lr=2e-2), rows),
        lambda examples, config, rows: (examples, config, options(max_steps=2, init="orthogonal")),
        lambda examples, config, rows: (examples, AdaptConfig(lr=1e-2, memory_tokens=2), rows),
        lambda examples, config, rows: (examples, config, options(max_steps=2, choice_weight=4.0)),
        lambda examples, config, rows: (examples, config, options(max_steps=2, route_weight=4.0)),
    ],
    ids=["data", "lora", "rows", "memory-tokens", "choice-weight", "route-weight"],
)
def test_the_adaptation_key_changes_with_the_data_and_every_setting(backbone, adaptation_examples, change):
    key = adaptation_key(backbone, adaptation_examples, FAST, options(max_steps=2))
    assert adaptation_key(backbone, *change(adaptation_examples, FAST, options(max_steps=2))) != key
    assert adaptation_key(backbone, adaptation_examples, FAST, options(max_steps=2, progress=True)) == key
    assert adaptation_key(backbone, adaptation_examples, FAST, options(max_steps=2, refit_index=True)) == key


def test_tokmem_adapt_saves_an_adapted_backbone_that_loads_by_its_directory(tmp_path, capsys):
    out = tmp_path / "adapted"
    assert (
        main(
            [
                "adapt",
                "--backbone",
                "tiny-random",
                "--out",
                str(out),
                "--samples",
                "60",
                "--max-length",
                "64",
                "--device",
                "cpu",
                "--quiet",
                "--checkpoint-every",
                "5",
                "--json",
                str(tmp_path / "adapt.json"),
            ]
        )
        == 0
    )
    info = json.loads((tmp_path / "adapt.json").read_text())
    assert info["examples"] == 60 and load_backbone(str(out)).fingerprint() == info["fingerprint"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapt.json", "adapted"]  # the checkpoints removed
    assert main(["adapt", "--backbone", "tiny-random", "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err


def documented_adapt_command() -> list[str]:
    """docs/tools.md's ``tokmem adapt`` command for a tool loop (its continued lines joined), without ``tokmem``."""
    text = (Path(__file__).parents[1] / "docs" / "tools.md").read_text()
    found = re.search(r"^tokmem adapt .*$", text.replace("\\\n", ""), re.MULTILINE)
    return shlex.split(found.group(0))[1:]


def test_tokmem_adapt_runs_the_documented_command_on_the_built_in_tool_chains(tmp_path):
    """docs/tools.md's command, smaller (an option given again: argparse takes the last)."""
    out, report = tmp_path / "adapted", tmp_path / "adapt.json"
    smaller = ["--backbone", "tiny-random", "--out", str(out), "--samples", "6", "--max-length", "256"]
    command = [*documented_adapt_command(), *smaller, "--device", "cpu", "--quiet", "--json", str(report)]
    assert main(command) == 0
    info = json.loads(report.read_text())
    assert info["data"] == "built-in chains" and info["examples"] == 6
    assert info["procedures"] <= len(TOOL_CHAIN_TOOLS)
    assert load_backbone(str(out)).fingerprint() == info["fingerprint"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapt.json", "adapted"]  # its checkpoints removed


def test_the_documented_adapt_command_adapts_as_the_tool_loop_study_does(backbone):
    """The command docs/tools.md gives is the study's adaptation (the same cache key for the same data)."""
    args = build_parser().parse_args(documented_adapt_command())
    assert (args.builtin, args.backbone) == ("chains", QWEN_05B)
    study = make_config("cpu", dataset="complexfuncbench", backbone=QWEN_05B, methods=("tokmem",)).resolved()
    assert adaptation_key(backbone, [], *adapt_settings(args)) == adaptation_key(
        backbone, [], study.adaptation(), adaptation_rows(study)
    )
    assert adaptation_key(backbone, [], AdaptConfig(), adapt_settings(args)[1]) != adaptation_key(
        backbone, [], *adapt_settings(args)
    )


def test_study_variants_differing_only_in_the_rows_renormalisation_or_loss_weights_share_one_adaptation(backbone):
    study = make_config("cpu", dataset="complexfuncbench", backbone=QWEN_05B, methods=("tokmem",)).resolved()
    variant = replace(study, renorm_every_step=True, renorm_target="tokens", choice_weight=5.0)
    assert adaptation_key(backbone, [], variant.adaptation(), adaptation_rows(variant)) == adaptation_key(
        backbone, [], study.adaptation(), adaptation_rows(study)
    )


def test_tokmem_adapt_resumes_only_from_checkpoints_it_saves(tmp_path, capsys):
    assert main(["adapt", "--backbone", "tiny-random", "--out", str(tmp_path / "adapted"), "--resume"]) == 2
    assert "resume goes on from the checkpoints" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
