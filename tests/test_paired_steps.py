"""Two runs' per-step answers paired step by step (benchmarks/paired_steps.py)."""

import json

import pytest
from helpers import load_script

from tokmem.data.procedures import call_json

paired_steps = load_script("paired_steps")

FIND, RENT = call_json("Find", {"city": "Oslo"}), call_json("Rent", {"id": "ab12"})


def record(query: str, *answers: str | None) -> dict:
    return {"query": query, "gold": [FIND, RENT], "step": list(answers)}


def test_each_step_is_counted_by_both_runs_outcomes_and_the_exact_steps_split_four_ways():
    first = [record("a", FIND, RENT), record("b", FIND, call_json("Find", {"city": "Bergen"}))]
    second = [record("b", FIND, FIND), record("a", None, call_json("Rent", {"id": "zz"}))]
    counted = paired_steps.paired(first, second)
    assert counted["steps"] == 4
    assert (counted["both exact"], counted["only the first exact"], counted["only the second exact"]) == (1, 2, 0)
    assert counted["neither exact"] == 1
    assert counted["outcomes (first, second)"] == {
        "exact / exact": 1,
        "exact / wrong values": 1,
        "exact / no call": 1,
        "wrong tool / repeat": 1,
    }


def test_the_mcnemar_p_value_is_the_two_sided_binomial_tail_of_the_discordant_steps():
    assert paired_steps.mcnemar(0, 5) == pytest.approx(2 / 32)
    assert paired_steps.mcnemar(1, 5) == pytest.approx(2 * 7 / 64)
    assert paired_steps.mcnemar(3, 3) == 1.0 and paired_steps.mcnemar(0, 0) == 1.0


def test_runs_of_other_records_or_other_gold_calls_are_refused():
    with pytest.raises(SystemExit, match="different records"):
        paired_steps.paired([record("a", FIND, RENT)], [record("b", FIND, RENT)])
    other = record("a", FIND, RENT) | {"gold": [RENT, FIND]}
    with pytest.raises(SystemExit, match="different gold calls"):
        paired_steps.paired([record("a", FIND, RENT)], [other])


def test_answers_are_read_from_a_study_a_loop_ab_or_a_reanswer_file_by_name(tmp_path):
    samples = [record("a", FIND, RENT)]
    for group in ("methods", "variants", "rules"):
        path = tmp_path / f"{group}.json"
        path.write_text(json.dumps({group: {"lora": {"samples": samples}, "tokmem": {"samples": []}}}))
        assert paired_steps.answers(f"{path}:lora") == samples
        with pytest.raises(SystemExit, match="name one of lora, tokmem"):
            paired_steps.answers(str(path))
    single = tmp_path / "single.json"
    single.write_text(json.dumps({"rules": {"as the study answers": {"samples": samples}}}))
    assert paired_steps.answers(str(single)) == samples
    with pytest.raises(SystemExit, match="no such result file"):
        paired_steps.answers(f"{tmp_path / 'missing.json'}:lora")
    (tmp_path / "none.json").write_text("{}")
    with pytest.raises(SystemExit, match="no answers"):
        paired_steps.answers(str(tmp_path / "none.json"))


def test_several_seeds_are_counted_each_and_pooled_step_by_step():
    seed0 = ([record("a", FIND, RENT)], [record("a", FIND, None)])
    seed1 = ([record("b", FIND, RENT)], [record("b", RENT, None)])
    result = paired_steps.pooled([seed0, seed1])
    assert [c["only the first exact"] for c in result["pairs"]] == [1, 2]
    pooled = result["pooled"]
    assert (pooled["steps"], pooled["both exact"], pooled["only the first exact"], pooled["only the second exact"]) == (
        4,
        1,
        3,
        0,
    )
    assert pooled["mcnemar p"] == pytest.approx(paired_steps.mcnemar(3, 0))
    assert pooled["outcomes (first, second)"]["exact / no call"] == 2


def test_the_command_line_takes_runs_in_pairs_and_writes_the_pooled_counts(tmp_path, monkeypatch, capsys):
    runs = []
    for seed, samples in enumerate(([record("a", FIND, RENT)], [record("b", FIND, RENT)])):
        path = tmp_path / f"seed{seed}.json"
        path.write_text(json.dumps({"variants": {"tokmem": {"samples": samples}, "lora": {"samples": samples}}}))
        runs += [f"{path}:tokmem", f"{path}:lora"]
    monkeypatch.setattr("sys.argv", ["paired_steps.py", *runs, "--json", str(tmp_path / "out.json")])
    paired_steps.main()
    written = json.loads((tmp_path / "out.json").read_text())
    assert [pair["first"] for pair in written["pairs"]] == runs[::2]
    assert written["pooled"]["both exact"] == 4
    assert "pooled exact: both 4" in capsys.readouterr().out
    monkeypatch.setattr("sys.argv", ["paired_steps.py", *runs[:3]])
    with pytest.raises(SystemExit):
        paired_steps.main()
    assert "runs come in pairs" in capsys.readouterr().err
