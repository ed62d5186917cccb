"""The loopback load test and soak scripts (benchmarks/serve_load_test.py, serve_soak.py), small."""

import json

from helpers import load_script


def test_concurrent_clients_over_many_banks_with_mid_run_replacement_lose_nothing_and_match_generate(lively_backbone):
    summary = load_script("serve_load_test").run(
        lively_backbone, banks=6, requests=30, concurrency=10, max_tokens=8, replace=2, time_limit=120, max_batch=8
    )
    assert summary["problems"] == [] and summary["ok"]
    assert summary["answered"] == summary["equal_to_generate"] == 30
    assert (
        summary["replaced_banks"] == 2
    )  # whether a request lands on a new version depends on timing; each answer is checked against its own version


def test_the_soak_answers_clean_requests_exactly_among_hostile_ones_and_the_server_exits_cleanly_on_sigterm(tmp_path):
    """A real `tokmem serve` child process on tiny-random."""
    load_script("serve_load_test")  # the soak reuses its clients and checks
    code = load_script("serve_soak").main(
        [
            "--requests",
            "60",
            "--concurrency",
            "8",
            "--banks",
            "4",
            "--replace",
            "2",
            "--max-tokens",
            "8",
            "--json",
            str(tmp_path / "soak.json"),
        ]
    )
    summary = json.loads((tmp_path / "soak.json").read_text())
    assert code == 0 and summary["ok"] and summary["problems"] == [] and summary["lost_or_hung"] == 0
    assert summary["equal_to_generate"] == summary["clean_requests"] == 40 and summary["hostile_requests"] == 20
    assert summary["sigterm"]["clean"] and summary["tracebacks_in_server_log"] == 0
