"""The research tree's command line, ``python -m research`` from the repository root."""

import subprocess
import sys
from pathlib import Path

import pytest

from research.cli import main
from tokmem.extras import EXTRAS

ROOT = Path(__file__).resolve().parents[2]


def test_python_m_research_lists_the_studies():
    result = subprocess.run(
        [sys.executable, "-m", "research", "bench", "--help"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    for study in ("atomic", "compositional", "placement"):
        assert study in result.stdout


@pytest.mark.parametrize("study", [["atomic"], ["placement", "--study", "gsm8k"], ["compositional"]])
def test_a_study_without_its_extra_fails_at_once_naming_the_extra(study, monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(EXTRAS, "studies", ("matplotlib", "tokmem_no_such_module"))
    assert main(["bench", *study, "--backbone", "tiny-random", "--json", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert "needs the 'studies' extra (tokmem_no_such_module not installed): pip install 'tokmem[studies]'" in err
    assert not (tmp_path / "x.json").exists()
