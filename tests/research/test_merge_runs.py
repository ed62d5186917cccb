"""research/scripts/merge_runs.py: a study run in pieces (a method a process, side by side on one GPU) made one run per
seed and budget, placed where ``--seeds`` reuses finished runs, so the study's command combines them unchanged."""

import json

import pytest
from research.scripts import merge_runs

from research.studies.compositional_report import _params_cell


def piece(method: str, seed: int = 0, lr: float = 0.01) -> dict:
    return {
        "study": "main",
        "config": {"seed": seed, "epochs": 2, "lr": lr, "device": "cuda", "methods": [method]},
        "adaptation": {"examples": 300} if method == "tokmem" else None,
        "methods": {method: {"label": method.upper(), "step": {"call_f1": {"avg": 50.0}}}},
    }


def test_the_pieces_of_a_seed_become_one_finished_run_with_the_methods_in_the_asked_order():
    run = merge_runs.merge_run([piece("lora"), piece("tokmem"), piece("native")], ["tokmem", "lora"])
    assert list(run["methods"]) == ["tokmem", "lora"] and run["config"]["methods"] == ["tokmem", "lora"]
    assert run["finished"] is True and run["adaptation"] == {"examples": 300}


def test_pieces_run_with_other_settings_or_lacking_a_method_are_refused_by_name():
    with pytest.raises(SystemExit, match="lr"):
        merge_runs.merge_run([piece("tokmem"), piece("lora", lr=0.1)], ["tokmem", "lora"])
    with pytest.raises(SystemExit, match="no piece has rag"):
        merge_runs.merge_run([piece("tokmem"), piece("lora")], ["tokmem", "rag"])


def test_each_seed_is_saved_where_the_seeds_option_reuses_finished_runs(tmp_path):
    paths = []
    for seed in (0, 1):
        for method in ("tokmem", "lora"):
            paths.append(tmp_path / f"s{seed}-{method}.json")
            paths[-1].write_text(json.dumps(piece(method, seed)))
    merge_runs.main([str(tmp_path / "all.json"), "--methods", "tokmem,lora", *map(str, paths)])
    for seed in (0, 1):
        run = json.loads((tmp_path / "all-runs" / f"epochs2-seed{seed}.json").read_text())
        assert run["config"]["seed"] == seed and list(run["methods"]) == ["tokmem", "lora"]


def test_a_parameter_count_that_differs_between_seeds_prints_as_its_range():
    assert _params_cell({"avg": 25536.0, "sd": 0.0, "per_seed": [25088, 25984, 25088]}) == "25,088–25,984"
    assert _params_cell(540672) == "540,672"
