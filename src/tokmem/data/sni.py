"""Super-Natural Instructions task files, read as upstream writes them (allenai/natural-instructions).

One file ``taskNNN_name.json`` per task::

    {"Definition": ["..."], "Input_language": ["English"], "Output_language": ["English"],
     "Instruction_language": ["English"], "Instances": [{"id": "...", "input": "...", "output": ["...", ...]}]}

Each task is one procedure named by its file stem.  Only English tasks are kept (all three language
fields exactly ``["English"]``); tasks come in ascending task-id order.  A task's instances are
shuffled with a fixed seed (per task), the first ``test_per_task`` become its test set and the next
``train_per_task`` its training set, so the test set stays the same whatever the training budget.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

from tokmem.data.procedures import Example, Step
from tokmem.errors import DataError

LANGUAGE_FIELDS = ("Input_language", "Output_language", "Instruction_language")
TASK_FILE = re.compile(r"^task(\d+)_\w+\.json$")


@dataclass(frozen=True)
class Instance:
    id: str
    input: str
    outputs: tuple[str, ...]  # every accepted answer; training uses the first


@dataclass
class Task:
    name: str
    number: int
    definition: str
    train: list[Instance] = field(default_factory=list)
    test: list[Instance] = field(default_factory=list)

    def examples(self, instances: list[Instance] | None = None) -> list[Example]:
        """Training examples: the instance input alone is the query (the memory token stands in for the definition)."""
        return [Example(i.input, (Step(self.name, i.outputs[0]),), id=i.id) for i in (self.train if instances is None else instances)]


@dataclass
class TaskFile:
    path: Path
    number: int
    definition: str
    languages: dict[str, list[str]]
    instances: list[Instance]

    @property
    def english(self) -> bool:
        return all(self.languages[key] == ["English"] for key in LANGUAGE_FIELDS)


def task_number(path: Path) -> int:
    match = TASK_FILE.match(path.name)
    if not match:
        raise DataError(f"{path}: not an SNI task file name (expected taskNNN_name.json)")
    return int(match.group(1))


def read_task(path) -> TaskFile:
    """Read and validate one task file; errors name the file and the field."""
    path = Path(path)
    number = task_number(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: not a valid JSON file ({err})") from None
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected a JSON object with 'Definition' and 'Instances'")
    definition = _strings(data, "Definition", path)
    languages = {key: _strings(data, key, path) for key in LANGUAGE_FIELDS}
    instances = data.get("Instances")
    if not isinstance(instances, list) or not instances:
        raise DataError(f"{path}: field 'Instances': missing or empty (must be a non-empty list)")
    parsed = [_instance(item, path, k) for k, item in enumerate(instances)]
    return TaskFile(path, number, " ".join(definition), languages, parsed)


def _strings(data: dict, key: str, path: Path) -> list[str]:
    value = data.get(key)
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise DataError(f"{path}: field '{key}': missing or not a non-empty list of strings")
    return value


def _instance(item, path: Path, k: int) -> Instance:
    where = f"{path}: field 'Instances[{k}]"
    if not isinstance(item, dict):
        raise DataError(f"{where}': expected an object with 'input' and 'output'")
    text = item.get("input")
    if not isinstance(text, str):
        raise DataError(f"{where}.input': missing or not a string")
    outputs = item.get("output")
    if not isinstance(outputs, list) or not outputs or not all(isinstance(o, str) for o in outputs):
        raise DataError(f"{where}.output': missing or not a non-empty list of strings")
    return Instance(str(item.get("id", f"{path.stem}-{k}")), text, tuple(outputs))


def load_tasks(
    tasks_dir, num_tasks: int | None = None, train_per_task: int = 500, test_per_task: int = 50,
    seed: int = 0, min_train: int | None = None,
) -> tuple[list[Task], list[dict]]:
    """The first ``num_tasks`` usable English tasks in ascending task-id order, split into train/test.

    A task is usable when it has at least ``test_per_task + min_train`` instances (``min_train``
    defaults to ``train_per_task``: every task gets its full training set).  Returns the tasks and
    the skipped files, each ``{"file", "reason"}``.
    """
    tasks_dir = Path(tasks_dir)
    if not tasks_dir.is_dir():
        raise DataError(f"{tasks_dir}: SNI tasks folder not found (point --tasks-dir at natural-instructions/tasks)")
    paths = sorted(tasks_dir.glob("task*.json"), key=task_number)
    if not paths:
        raise DataError(f"{tasks_dir}: no taskNNN_name.json files in this folder")
    needed = test_per_task + (train_per_task if min_train is None else min_train)
    tasks, skipped = [], []
    for path in paths:
        if num_tasks is not None and len(tasks) == num_tasks:
            break
        task = read_task(path)
        reason = _unusable(task, needed)
        if reason:
            skipped.append({"file": path.name, "reason": reason})
        else:
            tasks.append(_split(task, train_per_task, test_per_task, seed))
    return tasks, skipped


def _unusable(task: TaskFile, needed: int) -> str | None:
    if not task.english:
        return "not English (" + ", ".join(f"{k}={v}" for k, v in task.languages.items()) + ")"
    if len(task.instances) < needed:
        return f"only {len(task.instances)} instances ({needed} needed)"
    return None


def _split(task: TaskFile, train_per_task: int, test_per_task: int, seed: int) -> Task:
    instances = list(task.instances)
    random.Random(f"{seed}:{task.path.stem}").shuffle(instances)
    return Task(
        name=task.path.stem, number=task.number, definition=task.definition,
        test=instances[:test_per_task], train=instances[test_per_task : test_per_task + train_per_task],
    )
