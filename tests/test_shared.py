"""The shared data is found one way: $TOKMEM_SHARED_DATA, else the first shared/data at or above the working directory."""

from pathlib import Path

from tokmem.data.shared import shared_data


def test_shared_data_is_found_above_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "shared" / "data").mkdir(parents=True)
    work = tmp_path / "checkout" / "sub"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    monkeypatch.delenv("TOKMEM_SHARED_DATA", raising=False)
    assert shared_data("gsm8k") == Path("..", "..", "shared", "data", "gsm8k")
    assert shared_data("gsm8k").resolve() == (tmp_path / "shared" / "data" / "gsm8k").resolve()


def test_the_variable_overrides_the_search(tmp_path, monkeypatch):
    (tmp_path / "shared" / "data").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TOKMEM_SHARED_DATA", str(tmp_path / "elsewhere"))
    assert shared_data("sni", "tasks") == tmp_path / "elsewhere" / "sni" / "tasks"
