"""Command-line options generated from config dataclasses: one mapping, defaults only in the dataclass."""

import argparse
from dataclasses import asdict, dataclass
from typing import Literal

import pytest

from tokmem.training.adapt import AdaptConfig
from tokmem.cli import build_parser, main
from tokmem.cli.options import add_options, values
from tokmem.config import option
from tokmem.decoding.decode import DecodeConfig
from tokmem.training.lora import LoRASettings
from research.studies.compositional_config import make_config
from research.studies.settings import MethodSettings
from tokmem.training.train import TrainConfig


@dataclass
class Example:
    rate: float = option(0.5, "a rate")
    mode: Literal["fast", "slow"] = option("fast", "how to go", flag="--pace")
    sizes: tuple[int, ...] = option((1, 2), "sizes")
    names: tuple[str, ...] | None = option(None, "names")
    loud: bool = option(False, "shout")
    internal: int = 3  # no help: not an option


def parse(*argv, unset=False):
    parser = argparse.ArgumentParser()
    add_options(parser, Example, unset=unset)
    return parser, parser.parse_args(argv)


def test_options_take_type_default_choices_and_flag_from_the_fields():
    _, args = parse("--rate", "0.25", "--pace", "slow", "--sizes", "3,4", "--names", "a, b", "--loud")
    assert values(args, Example) == {"rate": 0.25, "mode": "slow", "sizes": (3, 4), "names": ("a", "b"), "loud": True}
    assert Example(**values(args, Example)).internal == 3
    _, defaults = parse()
    assert Example(**values(defaults, Example)) == Example()


def test_a_field_without_help_is_no_option_and_a_literal_refuses_other_values(capsys):
    parser, _ = parse()
    assert "--internal" not in parser.format_help() and "(default 0.5)" in parser.format_help()
    with pytest.raises(SystemExit):
        parser.parse_args(["--pace", "medium"])
    assert "invalid choice" in capsys.readouterr().err


def test_bools_are_on_off_pairs_and_unset_options_leave_the_preset_alone():
    _, args = parse("--no-loud", unset=True)
    assert values(args, Example) == {"loud": False}
    _, nothing = parse(unset=True)
    assert values(nothing, Example) == {}


@pytest.mark.parametrize("config", [TrainConfig, DecodeConfig])
def test_train_and_decode_options_default_to_their_configs(config):
    parser = argparse.ArgumentParser()
    add_options(parser, config)
    assert config(**values(parser.parse_args([]), config)) == config()


def test_a_study_setting_sets_the_config_field_it_names_and_defaults_to_it():
    options = dict(tokmem_lr=0.125, lora_lr=0.25, lora_rank=2, eval_batch_size=3, max_new_tokens=7, schedule="linear")
    config = make_config(None, "main", **options)
    train, decode, lora = config.train(), config.decode(), config.lora()
    assert (train.lr, train.schedule, lora.lr, lora.rank) == (0.125, "linear", 0.25, 2)
    assert (decode.batch_size, decode.max_new_tokens, decode.max_steps) == (3, 7, config.max_calls)
    assert config.adaptation() == AdaptConfig(rank=2)  # the adaptation's LoRA takes fine-tuning's rank
    settings = MethodSettings()
    assert settings.train() == TrainConfig() and settings.lora() == LoRASettings()
    assert settings.decode() == DecodeConfig(max_steps=1)


# What users type: ``tokmem train``'s and ``tokmem add``'s flags (generated from TrainConfig and the commands' own
# options), and the training defaults they get.  Regrouping TrainConfig's fields must change neither.
TRAINING_FLAGS = {
    "--batch-size", "--bf16", "--catalog", "--checkpoint-every", "--choice-weight", "--data", "--device", "--epochs",
    "--fsdp", "--grad-accum", "--help", "--init", "--json", "--key-order", "--key-sets", "--length-grouped", "--lr",
    "--lr-schedule", "--max-length", "--max-steps", "--near-misses", "--negatives", "--no-bf16", "--no-fsdp", "--no-key-sets",
    "--no-length-grouped", "--no-near-misses", "--no-refit-index", "--no-renorm", "--no-renorm-every-step", "--no-resume",
    "--no-segment-backprop", "--off-topic", "--out", "--prefix-cache-gib", "--quiet", "--refit-index", "--renorm",
    "--renorm-every-step", "--renorm-side", "--renorm-target", "--result-tokens", "--resume", "--route-weight",
    "--seed", "--segment-backprop", "--threshold", "--tool-segments", "--warmup", "--weight-decay", "-h",
}  # fmt: skip
BANK_FORM_FLAGS = {
    "--backbone",
    "--decoupled",
    "--no-decoupled",
    "--memory-tokens",
    "--shared-tokens",
    "--show-schemas",
}
TRAIN_DEFAULTS = {
    "lr": 5e-3, "weight_decay": 0.0, "epochs": 1, "batch_size": 4, "grad_accum": 1, "max_length": 1024,
    "max_steps": None, "seed": 0, "renormalize": True, "renorm_every_step": False, "renorm_target": "old_rows",
    "renorm_side": "index", "eps": 1e-8, "init": "mean", "schedule": "constant", "warmup": 0.1,
    "tool_segments": "arguments", "key_order": "calls", "choice_weight": 1.0, "route_weight": 1.0,
    "refit_index": False, "key_sets": False, "threshold": None, "negatives": 0.0, "near_misses": False,
    "result_tokens": 256,
    "segment_backprop": False,
    "length_grouped": False, "bf16": None, "prefix_cache_gib": None, "fsdp": False, "progress": True,
    "checkpoint": None, "checkpoint_every": 0, "resume": False,
}  # fmt: skip


@pytest.mark.parametrize(
    "command, flags", [("train", TRAINING_FLAGS | BANK_FORM_FLAGS), ("add", TRAINING_FLAGS | {"--bank"})]
)
def test_the_training_commands_list_the_flags_users_type(capsys, command, flags):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    shown = capsys.readouterr().out
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    offered = {flag for action in commands.choices[command]._actions for flag in action.option_strings}
    assert offered == flags and all(flag in shown for flag in flags)


def test_train_config_keeps_the_defaults_users_get():
    assert asdict(TrainConfig()) == TRAIN_DEFAULTS
