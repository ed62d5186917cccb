"""The study harness's repeats: per-seed results aggregated in one place, and one resumable run per budget and seed."""

import json

import pytest

from tokmem.errors import TokMemError
from research.studies.compositional_config import make_config
from research.studies.harness import aggregate_seeds, resumed, run_repeats
from research.studies.outputs import budget_markdown, budget_panels, line_plot, spread


def seed_result(seed: int, f1: float, label: str = "TokMem") -> dict:
    return {
        "study": "main",
        "config": {"seed": seed},
        "data": {"train": 10},
        "methods": {
            "tokmem": {
                "label": label,
                "updates": 5,
                "trainable_params": 64,
                "tool_f1": {"2": f1, "avg": f1},
                "samples": [{"predicted": [f"call {seed}"]}],
            }
        },
    }


def test_every_score_becomes_its_mean_sd_and_per_seed_values():
    combined = aggregate_seeds([seed_result(0, 50.0), seed_result(1, 70.0), seed_result(2, 60.0)], ("methods",))
    assert combined["seeds"] == [0, 1, 2]
    assert combined["methods"]["tokmem"]["tool_f1"]["avg"] == {
        "avg": 60.0,
        "sd": pytest.approx(10.0),
        "per_seed": [50.0, 70.0, 60.0],
    }


def test_labels_samples_updates_and_parameters_stay_as_the_first_seed_gives_them_and_other_keys_are_not_averaged():
    combined = aggregate_seeds([seed_result(0, 50.0), seed_result(1, 70.0)], ("methods",))
    tokmem = combined["methods"]["tokmem"]
    assert (tokmem["label"], tokmem["updates"], tokmem["trainable_params"]) == ("TokMem", 5, 64)
    assert tokmem["samples"] == [{"predicted": ["call 0"]}] and combined["data"] == {"train": 10}


def test_the_keys_wrong_key_sets_got_wrong_are_tallied_over_every_seed_a_key_missing_from_one_counting_zero():
    def with_keys(seed: int, left_out: dict) -> dict:
        result = seed_result(seed, 50.0)
        result["methods"]["tokmem"]["outcomes"] = {"wrong key sets, by key": {"left out": left_out, "added": {}}}
        return result

    combined = aggregate_seeds([with_keys(0, {"sort": 2}), with_keys(1, {"sort": 1, "adults": 3})], ("methods",))
    keys = combined["methods"]["tokmem"]["outcomes"]["wrong key sets, by key"]
    assert keys["left out"]["sort"]["per_seed"] == [2, 1]
    assert keys["left out"]["adults"]["per_seed"] == [0, 3]
    assert keys["added"] == {}


def test_one_seed_has_no_spread_and_its_table_cell_is_the_plain_number():
    def score(*f1s):
        runs = [seed_result(seed, f1) for seed, f1 in enumerate(f1s)]
        return aggregate_seeds(runs, ("methods",))["methods"]["tokmem"]["tool_f1"]["2"]

    assert score(40.0) == {"avg": 40.0, "sd": 0.0, "per_seed": [40.0]}
    assert spread(score(40.0)) == "40.0"
    assert spread(score(40.0, 40.0)) == "40.0 ± 0.0"  # seeds that agree: a spread of 0, printed


def study(config, path) -> dict:
    """A stand-in study run (what run_repeats drives, not what it is tested for): its score is the seed plus the epochs."""
    return seed_result(config.seed, float(config.seed + config.epochs)) | {
        "config": json.loads(json.dumps(config.__dict__))
    }


def test_a_study_runs_once_per_budget_and_seed_and_a_finished_run_is_not_run_again(tmp_path):
    config = make_config(
        None, "main", backbone="tiny-random", tools=4, adapt_tools=2, epoch_budgets=(1, 3), seeds=(0, 1)
    )
    runs = []
    result = run_repeats(
        config,
        lambda one, path: runs.append((one.epochs, one.seed)) or study(one, path),
        tmp_path / "r.json",
        ("methods",),
    )
    assert runs == [(1, 0), (1, 1), (3, 0), (3, 1)]
    assert result["seeds"] == [0, 1] and list(result["epoch_budgets"]) == ["1", "3"]
    assert result["epoch_budgets"]["3"]["methods"]["tokmem"]["tool_f1"]["avg"]["per_seed"] == [3.0, 4.0]
    assert json.loads((tmp_path / "r.json").read_text()) == result
    again = run_repeats(config, lambda one, path: runs.append("again"), tmp_path / "r.json", ("methods",))
    assert "again" not in runs and again["epoch_budgets"] == result["epoch_budgets"]


def test_a_finished_run_of_other_settings_is_an_error_not_a_silent_reuse(tmp_path):
    config = make_config(None, "main", backbone="tiny-random", tools=4, adapt_tools=2, seeds=(0,))
    run_repeats(config, study, tmp_path / "r.json", ("methods",))
    with pytest.raises(TokMemError, match="other settings"):
        run_repeats(
            make_config(None, "main", backbone="tiny-random", tools=3, adapt_tools=2, seeds=(0,)),
            study,
            tmp_path / "r.json",
            ("methods",),
        )


def test_past_the_first_budget_only_the_methods_that_train_run_again(tmp_path):
    config = make_config(
        None,
        "main",
        backbone="tiny-random",
        tools=4,
        adapt_tools=2,
        methods=("icl", "rag", "lora"),
        epoch_budgets=(1, 2),
        seeds=(0,),
    )
    runs = []
    run_repeats(
        config,
        lambda one, path: runs.append((one.epochs, one.methods)) or study(one, path),
        tmp_path / "r.json",
        ("methods",),
    )
    assert runs == [(1, ("icl", "rag", "lora")), (2, ("lora",))]
    untrained = make_config(
        None, "main", backbone="tiny-random", tools=4, adapt_tools=2, methods=("icl",), epoch_budgets=(1, 2), seeds=(0,)
    )
    assert list(run_repeats(untrained, study, tmp_path / "u.json", ("methods",))["epoch_budgets"]) == ["1"]


def test_a_run_saved_before_an_option_existed_resumes_when_the_option_is_at_its_default(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"study": "main", "config": {"epochs": 1}}))
    assert resumed(path, "main", {"epochs": 1, "new_option": True}, defaults={"new_option": True}) is not None
    with pytest.raises(TokMemError, match=r"other settings \(new_option\)"):
        resumed(path, "main", {"epochs": 1, "new_option": False}, defaults={"new_option": True})


def test_after_every_run_the_writer_saves_the_results_so_far_so_a_stopped_command_leaves_its_tables(tmp_path):
    config = make_config(
        None, "main", backbone="tiny-random", tools=4, adapt_tools=2, epoch_budgets=(1, 3), seeds=(0, 1)
    )
    written = []
    run_repeats(config, study, tmp_path / "r.json", ("methods",), lambda result: written.append(json.dumps(result)))
    so_far = [json.loads(w)["epoch_budgets"] for w in written]
    assert [{e: p["seeds"] for e, p in budgets.items()} for budgets in so_far] == [
        {"1": [0]},
        {"1": [0, 1]},
        {"1": [0, 1], "3": [0]},
        {"1": [0, 1], "3": [0, 1]},
    ]
    assert not (tmp_path / "r.json").exists()  # the writer, not the default, saved them


def test_the_budget_curve_says_which_seeds_a_budget_has_when_a_stopped_command_left_it_fewer():
    def point(seeds):
        return {"seeds": seeds, "score": {"avg": 50.0, "sd": 1.0, "per_seed": [50.0] * len(seeds)}}

    result = {"seeds": [0, 1, 2], "epoch_budgets": {"1": point([0, 1, 2]), "4": point([0]), "8": point([0, 1])}}
    table = budget_markdown(
        result, lambda p: {"TokMem": {"updates": 10, "score": p["score"]}}, {"score": "F1"}, lambda p: "# T\n\nbody\n"
    )
    assert (
        "| 1 epoch(s) each | 4 epoch(s) each (seed 0 of 0, 1, 2) | 8 epoch(s) each (seeds 0, 1 of 0, 1, 2) |" in table
    )
    assert "# At 1 epoch(s) each\n" in table and "# At 4 epoch(s) each (seed 0 of 0, 1, 2)\n" in table


def test_the_budget_plot_draws_the_seeds_sd_as_error_bars_and_a_single_run_as_a_plain_line(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    drawn = []
    errorbar = Axes.errorbar
    monkeypatch.setattr(Axes, "errorbar", lambda ax, *a, **k: drawn.append(k["label"]) or errorbar(ax, *a, **k))
    seeds = {"avg": 50.0, "sd": 2.0, "per_seed": [48.0, 50.0, 52.0]}
    one, four = {"updates": 10, "lora": seeds, "rag": 30.0}, {"updates": 40, "lora": seeds | {"avg": 80.0}, "rag": 31.0}

    def headline(point):
        return {
            "LoRA": {"updates": point["updates"], "f1": point["lora"]},
            "RAG (one run)": point | {"f1": point["rag"]},
        }

    panels = budget_panels({"epoch_budgets": {"1": one, "4": four}}, headline, {"f1": "F1"}, "F1")
    assert panels[0].series["LoRA"] == ([10, 40], [50.0, 80.0], [2.0, 2.0])
    assert panels[0].series["RAG (one run)"] == ([10, 40], [30.0, 31.0], [0.0, 0.0])
    assert line_plot(tmp_path / "curve.png", panels).stat().st_size > 0
    assert drawn == ["LoRA"]
