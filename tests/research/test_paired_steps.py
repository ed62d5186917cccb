"""Two runs' per-step answers paired step by step, and analysed by record (research/scripts/paired_steps.py)."""

import json
import lzma

import numpy as np
import pytest
from research.scripts import paired_steps

from tokmem.data.procedures import call_json


FIND, RENT = call_json("Find", {"city": "Oslo"}), call_json("Rent", {"id": "ab12"})
WRONG = call_json("Find", {"city": "Bergen"})


def record(query: str, *answers: str | None) -> dict:
    return {"query": query, "gold": [FIND, RENT], "step": list(answers)}


def steps(query: str, exact: int, wrong: int) -> dict:
    """A record of ``exact + wrong`` Find steps, the first ``exact`` answered right."""
    return {"query": query, "gold": [FIND] * (exact + wrong), "step": [FIND] * exact + [WRONG] * wrong}


def test_each_step_is_counted_by_both_runs_outcomes_and_the_exact_steps_split_four_ways():
    first = [record("a", FIND, RENT), record("b", FIND, WRONG)]
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


def test_answers_are_read_from_a_result_file_kept_compressed_as_results_keeps_large_ones(tmp_path):
    samples = [record("a", FIND, RENT)]
    path = tmp_path / "run.json.xz"
    path.write_bytes(lzma.compress(json.dumps({"methods": {"lora": {"samples": samples}}}).encode()))
    assert paired_steps.answers(f"{path}:lora") == samples


def test_the_sign_flip_p_value_counts_every_flip_of_the_records_differences():
    p = paired_steps.sign_flip_p
    assert p(np.array([1.0, 1.0, 1.0]), 1) == pytest.approx(2 / 8)  # all three one way: 2 flips of 8 as far
    assert p(np.array([3.0, 1.0, 1.0, 0.0]), 1) == pytest.approx(2 / 8)  # a record without a difference flips nothing
    assert p(np.array([2.0, -1.0]), 1) == 1.0 and p(np.zeros(4), 1) == 1.0
    assert p(np.array([0.5, 0.5]), 2) == pytest.approx(2 / 4)  # averages over two seeds
    assert p(np.ones(20), 1) == pytest.approx(2 / 2**20)


def test_a_gain_concentrated_in_one_record_is_no_evidence_where_the_same_gain_spread_over_records_is():
    others = [steps(f"other {k}", 1, 0) for k in range(12)]
    concentrated = (others + [steps("long", 8, 0)], others + [steps("long", 0, 8)])
    spread = (
        others + [steps(f"short {k}", 1, 0) for k in range(8)],
        others + [steps(f"short {k}", 0, 1) for k in range(8)],
    )
    one, many = (paired_steps.by_record([runs])["first minus second"] for runs in (concentrated, spread))
    assert one["steps"] == many["steps"] == 8.0
    assert (one["records differing"], many["records differing"]) == (1, 8)
    assert one["sign-flip p"] == 1.0 and many["sign-flip p"] == pytest.approx(2 / 2**8)
    assert one["95% interval"][0] == 0.0 < many["95% interval"][0]  # a resample without the one record gains nothing
    assert one["95% interval"][1] - one["95% interval"][0] > many["95% interval"][1] - many["95% interval"][0]


def test_seeds_are_averaged_record_by_record_not_counted_as_new_records():
    records = [f"r{k}" for k in range(5)]
    seed = ([steps(q, 1, 0) for q in records], [steps(q, 0, 1) for q in records])  # the first ahead on every record
    analysis = paired_steps.by_record([seed, seed])
    assert (analysis["records"], analysis["seeds"], analysis["steps"]) == (5, 2, 5)
    assert analysis["first exact"]["steps"] == 5.0 and analysis["second exact"]["steps"] == 0.0  # a seed's
    assert analysis["first minus second"]["sign-flip p"] == pytest.approx(2 / 2**5)  # 5 records, not 10 items
    undone = ([steps("r0", 0, 1)] + seed[0][1:], [steps("r0", 1, 0)] + seed[1][1:])  # r0 goes the other way
    averaged = paired_steps.by_record([seed, undone])["first minus second"]
    assert averaged["steps"] == 4.0 and averaged["records differing"] == 4  # r0 averages to no difference
    with pytest.raises(SystemExit, match="the seeds answered different records"):
        paired_steps.by_record([seed, ([steps("new", 1, 0)], [steps("new", 1, 0)])])


def test_the_intervals_are_the_same_on_every_run():
    runs = [([steps(f"r{k}", k % 3, 1) for k in range(9)], [steps(f"r{k}", 1, k % 3) for k in range(9)])]
    assert paired_steps.by_record(runs) == paired_steps.by_record(runs)


def test_the_command_line_takes_runs_in_pairs_and_writes_each_pair_and_the_analysis_by_record(
    tmp_path, monkeypatch, capsys
):
    runs = []
    for seed in range(2):
        path = tmp_path / f"seed{seed}.json"
        samples = [record("a", FIND, RENT), record("b", FIND, WRONG)]
        path.write_text(json.dumps({"variants": {"tokmem": {"samples": samples}, "lora": {"samples": samples}}}))
        runs += [f"{path}:tokmem", f"{path}:lora"]
    monkeypatch.setattr("sys.argv", ["paired_steps.py", *runs, "--json", str(tmp_path / "out.json")])
    paired_steps.main()
    written = json.loads((tmp_path / "out.json").read_text())
    assert [pair["first"] for pair in written["pairs"]] == runs[::2]
    assert written["summed over the seeds"]["both exact"] == 6
    assert written["by record"]["first exact"]["steps"] == 3.0 and written["by record"]["seeds"] == 2
    assert "first minus second: +0.0 [+0.0, +0.0]; sign-flip p = 1" in capsys.readouterr().out
    monkeypatch.setattr("sys.argv", ["paired_steps.py", *runs[:3]])
    with pytest.raises(SystemExit):
        paired_steps.main()
    assert "runs come in pairs" in capsys.readouterr().err
