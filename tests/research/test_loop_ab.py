"""The A/B script's variants (research/scripts/loop_ab.py): each a name and study settings, read as the study takes them."""

import argparse
import json
from types import SimpleNamespace

import pytest
import torch
from helpers import Interrupted
from research.scripts import loop_ab

from tokmem.data.procedures import Example, Step, call_json
from tokmem.decoding.decode import DecodeConfig
from research.methods.lora import LoRA
from research.methods.tokmem import TokMem
from research.studies.harness import progress_bar
from tokmem.training.train import TrainConfig


def test_a_variant_names_study_settings_with_values_read_as_json_where_they_parse():
    assert loop_ab.variant("tokens:renorm_every_step=true,renorm_target=tokens") == (
        "tokens",
        {"renorm_every_step": True, "renorm_target": "tokens"},
    )
    assert loop_ab.variant("lr:tokmem_lr=5e-3") == ("lr", {"tokmem_lr": 0.005})
    assert loop_ab.variant("baseline:") == ("baseline", {})
    assert loop_ab.variant('own:methods=["tokmem"],adapt_data=["bfcl","study"],seed=1') == (
        "own",
        {"methods": ["tokmem"], "adapt_data": ["bfcl", "study"], "seed": 1},
    )
    assert dict(map(loop_ab.variant, loop_ab.KEY_ORDERS)) == {
        "calls": {"key_order": "calls"},
        "schema": {"key_order": "schema"},
    }


@pytest.mark.parametrize("text", ["x:no_such_setting=1", "x:tokmem_lr", ":tokmem_lr=1"])
def test_a_variant_that_is_not_a_name_and_study_settings_is_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="variant"):
        loop_ab.variant(text)


def test_what_a_variant_learned_is_kept_and_restored_for_tokmem_banks_and_lora_adapters(backbone, tmp_path):
    examples = [Example(f"say {k}", (Step("say", f"word {k}"),)) for k in range(4)]
    train = TrainConfig(epochs=1, batch_size=2, max_length=32)
    for make in (lambda: TokMem(backbone, train), lambda: LoRA(backbone, train)):
        learned, fresh = make(), make()
        assert not loop_ab.restore(fresh, tmp_path / type(learned).__name__)  # nothing kept yet
        learned.learn(examples)
        loop_ab.keep(learned, tmp_path / type(learned).__name__)
        assert loop_ab.restore(fresh, tmp_path / type(learned).__name__)
        if isinstance(learned, TokMem):
            assert torch.equal(fresh.model.bank.index, learned.model.bank.index)
        else:
            assert all(torch.equal(fresh.adapter.weights[k], v) for k, v in learned.adapter.weights.items())
            assert fresh.updates == learned.updates > 0


def test_a_tokmem_variant_is_checkpointed_while_it_trains_and_its_checkpoint_dropped_once_kept(backbone, tmp_path):
    examples = [Example(f"say {k}", (Step("say", f"word {k}"),)) for k in range(4)]
    method, kept = TokMem(backbone, TrainConfig(epochs=1, batch_size=2, max_length=32)), tmp_path / "banks" / "calls"
    checkpoint = loop_ab.resumable(method, kept)
    assert loop_ab.resumable(LoRA(backbone), kept) is None
    method.learn(examples)
    written = sorted(p.name for p in kept.parent.iterdir())
    assert written == [f"calls-checkpoint.safetensors{end}" for end in ("", ".json", ".train-state.pt")]
    loop_ab.keep(method, kept)
    loop_ab.drop_checkpoint(checkpoint)
    assert sorted(p.name for p in kept.parent.iterdir()) == ["calls.safetensors", "calls.safetensors.json"]


def test_a_variant_resumed_after_an_interruption_counts_the_updates_taken_before_it(backbone, tmp_path):
    examples = [Example(f"say {k}", (Step("say", f"word {k}"),)) for k in range(8)]  # 4 updates of batch 2
    kept = tmp_path / "banks" / "calls"

    def stop_halfway(fraction: float) -> None:
        if fraction >= 0.5:
            raise Interrupted

    interrupted, resumed = (TokMem(backbone, TrainConfig(epochs=1, batch_size=2, max_length=32)) for _ in range(2))
    loop_ab.resumable(interrupted, kept)
    interrupted.on_step = stop_halfway
    with pytest.raises(Interrupted):
        interrupted.learn(examples)
    loop_ab.resumable(resumed, kept)
    resumed.learn(examples)
    assert resumed.learn_report["resumed"]["from_step"] == 2
    assert resumed.updates == 4


def test_routing_is_scored_for_tokmem_alone_a_method_without_memory_tokens_has_none(backbone):
    chain = (
        Step("Find", call_json("Find", {"query": "Marriott"}), '{"lat":32.87}'),
        Step("Rent", call_json("Rent", {"lat": 32.87}), '{"cars":3}'),
    )
    data = SimpleNamespace(test=[Example("Rent a car.", chain), Example("Find it.", chain[:1])])
    decode = DecodeConfig(max_steps=2, max_new_tokens=6)
    for method in (TokMem(backbone, decode=decode), LoRA(backbone, decode=decode)):
        method.learn(data.test)
        answered = loop_ab.per_step(method, data, set(), progress_bar(False))
        routed = isinstance(method, TokMem)
        assert ("routing_f1" in answered["step"]) is routed  # LoRA's would read 0: no memory token chose a tool
        assert all(("routes" in sample) is routed for sample in answered["samples"])
        assert answered["step"]["steps"]["all"] == 3


def study_args(tmp_path, **changes) -> SimpleNamespace:
    options = dict(seed=0, backbone="tiny-random", split="dev", preset_file=None, json=str(tmp_path / "ab.json"))
    return SimpleNamespace(**options | changes)


def test_a_files_config_names_its_split_and_the_methods_its_variants_ran(tmp_path):
    variants = {"adapted": {"settings": {"methods": ["tokmem"]}}, "plain": {"settings": {"key_order": "calls"}}}
    config = loop_ab.file_config(study_args(tmp_path, seed=2), variants)
    assert (config["methods"], config["seed"], config["split"]) == (["tokmem", "tokmem-noadapt"], 2, "dev")
    assert "method" not in config and "preset_file" not in config  # no single method for variants that differ
    recipe = tmp_path / "recipe.json"
    recipe.write_text('{"tokmem_lr": 0.01}')
    frozen = loop_ab.file_config(study_args(tmp_path, split="test", preset_file=str(recipe)), {})
    assert frozen["preset_file"] == str(recipe) and len(frozen["preset_sha256"]) == 64


def test_a_file_of_another_seed_split_or_backbone_is_not_continued(tmp_path):
    args = study_args(tmp_path)
    assert loop_ab.opened(args) == {}
    saved = {"config": loop_ab.file_config(args, {}), "backbone": "tiny-random", "variants": {}}
    (tmp_path / "ab.json").write_text(json.dumps(saved))
    assert loop_ab.opened(args) == saved
    for changes, said in (
        (dict(split="test"), "split dev"),
        (dict(seed=1), "seed 0"),
        (dict(backbone="x"), "backbone tiny-random"),
    ):
        with pytest.raises(SystemExit, match=f"answered another study \\({said}"):
            loop_ab.opened(study_args(tmp_path, **changes))
    saved["config"] = {"preset": "cpu", "dataset": "complexfuncbench", "method": "tokmem-noadapt", "seed": 0}
    (tmp_path / "ab.json").write_text(json.dumps(saved))  # a file from before the splits
    with pytest.raises(SystemExit, match="split None"):
        loop_ab.opened(args)
