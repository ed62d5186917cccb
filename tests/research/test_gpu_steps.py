"""research/scripts/gpu_qwen.sh's study steps: each is a `python -m research bench` command the CLI takes and whose
study settings it can build, so that a lent device's few minutes are not spent on a mistyped flag."""

import re
import shlex
from pathlib import Path

import pytest

from research.cli import build_parser, compositional_config

SCRIPT = Path(__file__).parents[2] / "research" / "scripts" / "gpu_qwen.sh"
LOOP_VALUES = {"seed": "0", "m": "tokmem", "n": "120", "k": "2", "runs": "/tmp/runs"}  # a value each loop takes


def steps() -> list[tuple[str, list[str]]]:
    """(name, the `bench` arguments) of every `step` line, its continuation lines joined and its shell
    variables expanded: the script's own `NAME="..."` settings, and one value of each loop."""
    text = SCRIPT.read_text().replace("\\\n", " ")
    settings = dict(re.findall(r'^(\w+)="([^"$]*)"', text, re.M))

    def expand(words: str) -> str:
        words = re.sub(r"\$\{(\w+)/([^/}]*)/([^}]*)\}", lambda m: settings[m[1]].replace(m[2], m[3]), words)
        return re.sub(r"\$(\w+)", lambda m: settings.get(m[1], LOOP_VALUES.get(m[1], m[0])), words)

    found = re.findall(r"^\s*step (\S+) ([^#\n]*)", text, re.M)
    return [(expand(name), shlex.split(expand(words))) for name, words in found]


STEPS = steps()


def test_the_script_has_its_study_steps():
    names = [name for name, _ in STEPS]
    assert len(names) > 20 and "cfbshared1refit-s0-tokmem" in names


@pytest.mark.parametrize("name,arguments", STEPS, ids=[name for name, _ in STEPS])
def test_each_study_step_is_a_bench_command_whose_settings_build(name, arguments):
    assert not [word for word in arguments if "$" in word], f"{name}: a shell variable the test does not expand"
    args = build_parser().parse_args(["bench", *arguments])
    if arguments[0] == "compositional":
        compositional_config(args).resolved()
