"""The `tokmem` command end to end on the tiny-random backbone."""

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tokmem as tokmem_package
from tokmem.bank.memory_bank import MemoryBank
from tokmem.bank.file_format import metadata_path
from tokmem.cli import main
from tokmem.data import Example, Step, save_examples
from tokmem.training.train import NEGATIVES, UPDATES_PER_ROW

WORDS = ["apple", "house", "table", "chair", "green", "water"]


@pytest.fixture
def data(tmp_path):
    first = [Example(f"Reverse {w}.", (Step("reverse", w[::-1]),)) for w in WORDS]
    first += [Example(f"Upper {w}.", (Step("upper", w.upper()),)) for w in WORDS]
    second = [Example(f"Double {w}.", (Step("double", w + w),)) for w in WORDS]
    save_examples(first, tmp_path / "first.jsonl")
    save_examples(second, tmp_path / "second.jsonl")
    (tmp_path / "catalog.jsonl").write_text('{"name": "reverse", "description": "Reverse a word."}\n')
    return tmp_path


def tokmem(*args) -> int:
    return main([str(a) for a in args])


def train_bank(data, name="bank.safetensors", file="first.jsonl", epochs=("--epochs", 1)):
    """A bank trained on ``file``; one epoch unless ``epochs`` is empty (then ``train`` picks the budget)."""
    bank = data / name
    assert (
        tokmem(
            "train",
            *epochs,
            "--data",
            data / file,
            "--out",
            bank,
            "--backbone",
            "tiny-random",
            "--device",
            "cpu",
            "--catalog",
            data / "catalog.jsonl",
            "--quiet",
            "--json",
            data / "train.json",
        )
        == 0
    )
    return bank


def test_train_writes_a_bank_with_its_procedures_and_a_json_report(data):
    bank = MemoryBank.load(train_bank(data))
    assert bank.names == ["reverse", "upper"]
    assert bank.descriptions[0] == "Reverse a word."
    report = json.loads((data / "train.json").read_text())
    assert report["procedures"] == ["reverse", "upper"] and 0 <= report["train"]["open_set_fallbacks"] <= 12


def test_train_picks_enough_epochs_for_its_updates_per_new_procedure_unless_told(data, capsys):
    train_bank(data, epochs=())  # 12 examples of 2 procedures and their off-topic negatives at batch 4
    trained = 12 + round(12 * NEGATIVES)
    picked = json.loads((data / "train.json").read_text())["train"]["steps"]
    epochs = math.ceil(UPDATES_PER_ROW * 2 * 4 / trained)
    assert picked == math.ceil(epochs * trained / 4) >= UPDATES_PER_ROW * 2
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert f"training {epochs} epochs (picked for 2 new procedures; --epochs sets it) at lr 0.02, linear" in out
    assert (
        tokmem(
            "train",
            "--data",
            data / "first.jsonl",
            "--out",
            data / "one.safetensors",
            "--backbone",
            "tiny-random",
            "--epochs",
            1,
            "--quiet",
            "--json",
            data / "one.json",
        )
        == 0
    )
    assert json.loads((data / "one.json").read_text())["train"]["steps"] == math.ceil(trained / 4)  # one epoch


def test_eval_counts_the_open_set_fallbacks_and_says_how_to_fix_them_when_most_fall_back(data, capsys):
    path = train_bank(data)
    capsys.readouterr()
    args = ("eval", "--bank", path, "--data", data / "first.jsonl", "--max-new-tokens", 2, "--json", data / "e.json")
    assert tokmem(*args, "--threshold", 1.01) == 0  # no memory mass reaches it: every query falls back
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "open-set fallbacks: 12 of 12 held-out queries" in out and "warning: most held-out queries" in out
    assert "--epochs" in out and "--lr" in out and "--threshold" in out
    assert json.loads((data / "e.json").read_text())["open_set_fallbacks"] == 12
    assert tokmem(*args, "--threshold", 0.0) == 0
    assert "open-set fallbacks: 0 of 12" in (out := capsys.readouterr().out) and "warning: most" not in out


def test_add_grows_the_bank_and_keeps_old_rows(data):
    path = train_bank(data)
    before = MemoryBank.load(path)
    assert tokmem("add", "--bank", path, "--data", data / "second.jsonl", "--device", "cpu", "--quiet") == 0
    after = MemoryBank.load(path)
    assert after.names == ["reverse", "upper", "double"]
    assert (after.index[:2] == before.index).all()
    assert after.norms()[2].item() == pytest.approx(before.norms().mean().item(), rel=1e-4)


def test_a_checkpointed_training_leaves_only_its_bank_once_it_ends(data):
    bank = data / "bank.safetensors"
    command = ("train", "--epochs", 1, "--data", data / "first.jsonl", "--out", bank, "--backbone", "tiny-random")
    assert tokmem(*command, "--checkpoint-every", 1, "--resume", "--quiet", "--json", data / "t.json") == 0
    assert MemoryBank.load(bank).names == ["reverse", "upper"]
    assert json.loads((data / "t.json").read_text())["train"]["resumed_from_step"] == 0
    assert not list(data.glob("*.train-state.pt"))


def test_add_refuses_to_checkpoint_over_the_bank_it_grows(data, capsys):
    path = train_bank(data)
    before = path.read_bytes()
    add = ("add", "--bank", path, "--data", data / "second.jsonl", "--device", "cpu", "--quiet")
    assert tokmem(*add, "--checkpoint-every", 1) == 2
    assert "give --out, or it would overwrite --bank" in " ".join(capsys.readouterr().err.split())
    assert path.read_bytes() == before


def test_run_and_eval_report_json(data):
    path = train_bank(data)
    assert (
        tokmem(
            "run",
            "--bank",
            path,
            "Reverse table.",
            "--max-new-tokens",
            4,
            "--device",
            "cpu",
            "--json",
            data / "run.json",
        )
        == 0
    )
    run = json.loads((data / "run.json").read_text())["results"][0]
    assert run["query"] == "Reverse table." and 0.0 <= run["memory_mass"] <= 1.0
    assert (
        tokmem(
            "eval",
            "--bank",
            path,
            "--data",
            data / "first.jsonl",
            "--max-new-tokens",
            4,
            "--device",
            "cpu",
            "--json",
            data / "eval.json",
        )
        == 0
    )
    result = json.loads((data / "eval.json").read_text())
    assert result["examples"] == 12 and 0.0 <= result["routing_accuracy"] <= 1.0
    assert set(result["per_procedure"]) == {"reverse", "upper"} and result["calls"] is None


def test_bank_show_rm_rename_merge(data, capsys):
    path = train_bank(data)
    assert tokmem("bank", "show", path, "--json", data / "show.json") == 0
    assert json.loads((data / "show.json").read_text())["names"] == ["reverse", "upper"]
    assert tokmem("bank", "rename", path, "upper", "shout") == 0
    other = data / "other.safetensors"
    shutil.copy(path, other)
    shutil.copy(metadata_path(path), metadata_path(other))
    assert tokmem("bank", "rm", other, "reverse") == 0
    assert tokmem("bank", "rename", other, "shout", "yell") == 0
    assert tokmem("bank", "merge", path, other, "--out", data / "merged.safetensors") == 0
    assert MemoryBank.load(data / "merged.safetensors").names == ["reverse", "shout", "yell"]


def test_train_with_show_schemas_writes_a_bank_that_says_it_shows_them(data, capsys):
    path = data / "shown.safetensors"
    command = ("train", "--epochs", 1, "--data", data / "first.jsonl", "--out", path, "--show-schemas", "--quiet")
    assert tokmem(*command, "--backbone", "tiny-random", "--device", "cpu") == 0
    assert MemoryBank.load(path).shows_schemas and not MemoryBank.load(train_bank(data)).shows_schemas
    capsys.readouterr()
    assert tokmem("bank", "show", path) == 0
    assert "shows its tools schemas" in capsys.readouterr().out


def test_train_refits_the_routing_side_by_default_even_of_a_coupled_bank_and_says_how_it_routes(data, capsys):
    path = data / "refit.safetensors"
    command = (
        "train",
        "--epochs",
        1,
        "--data",
        data / "first.jsonl",
        "--out",
        path,
        "--quiet",
        "--json",
        data / "r.json",
    )
    assert tokmem(*command, "--no-decoupled", "--backbone", "tiny-random", "--device", "cpu") == 0
    train = json.loads((data / "r.json").read_text())["train"]
    refit, states = train["refit"], 12 + train["negatives"]  # each memory token's, each negative's routing position
    assert (
        train["negatives"] == round(12 * NEGATIVES)
        and refit["states"] == states == refit["routed_after"]
        and refit["seconds"] > 0
    )
    out = " ".join(capsys.readouterr().out.split())
    assert f"{states} of {states} routing positions right, a memory token or words where none fits (before: " in out
    plain = data / "plain.safetensors"
    no_refit = ("--no-refit-index", "--no-decoupled", "--backbone", "tiny-random", "--device", "cpu")
    assert tokmem(*command[:6], plain, "--quiet", *no_refit) == 0
    bank, trained = MemoryBank.load(path), MemoryBank.load(plain)
    assert bank.decoupled and bank.steer.equal(trained.index) and not bank.index.equal(trained.index)
    assert not trained.decoupled  # --no-refit-index: the rows as trained, the matrix asked for


@pytest.mark.parametrize(
    ("flag", "form", "shown"),
    [
        ("--memory-tokens", "memory_tokens", "2 memory tokens a tool"),
        ("--shared-tokens", "shared_tokens", "2 shared rows"),
    ],
)
def test_train_with_memory_tokens_or_shared_rows_writes_a_bank_of_that_form_and_refuses_text_procedures(
    data, capsys, flag, form, shown
):
    calls = [
        Example(f"Weather in {c}.", (Step("city", f'{{"name":"city","arguments":{{"city":"{c}"}}}}'),)) for c in WORDS
    ]
    save_examples(calls, data / "calls.jsonl")
    path = data / "tails.safetensors"
    command = ("train", "--epochs", 1, "--out", path, flag, 2, "--quiet", "--backbone", "tiny-random")
    assert tokmem(*command, "--data", data / "calls.jsonl", "--device", "cpu") == 0
    assert getattr(MemoryBank.load(path), form) == 2
    capsys.readouterr()
    assert tokmem("bank", "show", path) == 0
    assert shown in capsys.readouterr().out
    assert tokmem(*command, "--data", data / "first.jsonl", "--device", "cpu") == 2
    err = capsys.readouterr().err
    assert "holds tools only; 'reverse' is a text procedure" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "args, message",
    [
        (("bank", "show", "missing.safetensors"), "bank file not found"),
        (("bank", "rm", "{bank}", "nope"), "no procedure 'nope'"),
        (("bank", "rename", "{bank}", "reverse", "upper"), "already in the bank"),
        (("eval", "--bank", "{bank}", "--data", "{second}", "--device", "cpu"), "unknown procedure 'double'"),
    ],
)
def test_bad_input_is_a_one_line_error_not_a_traceback(data, capsys, args, message):
    bank = train_bank(data)
    args = [str(a).format(bank=bank, second=data / "second.jsonl") for a in args]
    assert tokmem(*args) == 2
    err = capsys.readouterr().err
    assert "error:" in err and message in err and "Traceback" not in err


def test_malformed_training_file_names_file_and_line(data, capsys):
    (data / "bad.jsonl").write_text('{"query": "q", "steps": [{"procedure": "p", "response": "r"}]}\n{"query": "q"}\n')
    assert (
        tokmem(
            "train",
            "--data",
            data / "bad.jsonl",
            "--out",
            data / "b.safetensors",
            "--backbone",
            "tiny-random",
            "--quiet",
        )
        == 2
    )
    assert "bad.jsonl:2: field 'steps'" in capsys.readouterr().err
    assert not (data / "b.safetensors").exists()


@pytest.mark.parametrize(
    "command", [("train", "--backbone", "no-such-backbone"), ("add", "--bank", "missing.safetensors")]
)
def test_a_bad_training_setting_is_refused_before_the_backbone_or_bank_loads(data, capsys, command):
    """Neither the unknown backbone nor the missing bank is reached: the setting is checked first."""
    args = (*command, "--data", data / "first.jsonl", "--out", data / "b.safetensors", "--choice-weight", "0")
    assert tokmem(*args, "--quiet") == 2
    err = capsys.readouterr().err
    assert "choice_weight is a loss weight, above 0: got 0" in err and "Traceback" not in err
    assert not (data / "b.safetensors").exists()


def test_training_warns_how_many_sequences_max_length_truncated_and_how(data, capsys):
    """At 24 tokens every query loses its start; a long answer loses its end too (the query keeps half)."""
    short = [Example(f"Reverse {w}.", (Step("reverse", w[::-1]),)) for w in WORDS[:3]]
    long = [Example(f"Repeat {w}.", (Step("repeat", " ".join([w] * 20)),), id=f"repeat-{w}") for w in WORDS[:2]]
    save_examples(short + long, data / "mixed.jsonl")
    assert (
        tokmem(
            "train",
            "--data",
            data / "mixed.jsonl",
            "--out",
            data / "b.safetensors",
            "--backbone",
            "tiny-random",
            "--device",
            "cpu",
            "--quiet",
            "--max-length",
            24,
            "--negatives",
            0,
            "--json",
            data / "t.json",
        )
        == 0
    )
    out = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert (
        "warning: 5 of 5 training sequences were longer than 24 tokens" in out
        and "5 lost the start of their query, 2 the end of their responses" in out
    )
    summary = json.loads((data / "t.json").read_text())["train"]
    assert (summary["truncated_sequences"], summary["truncated_queries"], summary["truncated_responses"]) == (5, 5, 2)


def test_console_script_is_installed():
    script = Path(sys.executable).with_name("tokmem")
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, check=True)
    for command in ("demo", "train", "add", "run", "eval", "bank"):
        assert command in result.stdout


def test_version_flag_prints_the_installed_version(capsys):
    with pytest.raises(SystemExit) as exited:
        tokmem("--version")
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"tokmem {tokmem_package.__version__}"
