"""The loopback load test script (benchmarks/serve_load_test.py), small: a real uvicorn server on 127.0.0.1."""

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "serve_load_test.py"


def load_script():
    spec = importlib.util.spec_from_file_location("serve_load_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_concurrent_clients_over_many_banks_with_mid_run_replacement_lose_nothing_and_match_generate(lively_backbone):
    summary = load_script().run(lively_backbone, banks=6, requests=30, concurrency=10, max_tokens=8, replace=2,
                                time_limit=120, max_batch=8)
    assert summary["problems"] == [] and summary["ok"]
    assert summary["answered"] == summary["equal_to_generate"] == 30
    assert summary["replaced_banks"] == 2  # whether a request lands on a new version depends on timing; each answer is checked against its own version
