"""Super-Natural Instructions task files, read in every layout upstream (allenai/natural-instructions) released.

One file ``taskNNN_name.json`` per task; the current layout::

    {"Definition": ["..."], "Input_language": ["English"], "Output_language": ["English"],
     "Instruction_language": ["English"], "Instances": [{"id": "...", "input": "...", "output": ["...", ...]}]}

Older revisions give ``Definition`` as a plain string and have no language fields; both are read.
Each task is one procedure named by its file stem.  Only English tasks are kept: every language
field a file has must be exactly ``["English"]``; a field it lacks is unknown, and such a task is
kept with the missing fields named (``Task.unknown_languages``).  Tasks come in ascending task-id
order (the paper's).

The split is the reference code's: a task's instances sorted by the MD5 of ``id||input||output[0]``,
the first ``test_per_task`` are the test set and the next ``train_per_task`` (or as many as remain)
the training set, so the test set never depends on the training budget or a seed.

A query (the user turn every method sees) is ``{Definition}\\n\\n{input}`` in the paper's protocol
(``definition``, as the reference code builds it), or the instance input alone (``input``: the
memory token must then carry the instruction).  Training answers and ROUGE-L use ``output[0]``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from tokmem.data.procedures import Example, Step, stable_hash
from tokmem.errors import DataError

LANGUAGE_FIELDS = ("Input_language", "Output_language", "Instruction_language")
TASK_FILE = re.compile(r"^task(\d+)_\w+\.json$")
QUERIES = ("definition", "input")


@dataclass(frozen=True)
class Instance:
    id: str  # as the file gives it; "" when it gives none
    input: str
    outputs: tuple[str, ...]  # every accepted answer; training and scoring use the first

    @property
    def reference(self) -> str:
        return self.outputs[0]


def user_turn(definition: str, text: str, query: str) -> str:
    """What a method is asked: the definition, a blank line and the input (``definition``), or the input alone."""
    if query not in QUERIES:
        raise DataError(f"unknown query mode '{query}': choose from {', '.join(QUERIES)}")
    return f"{definition}\n\n{text}" if query == "definition" else text


@dataclass
class Task:
    name: str
    number: int
    definition: str
    train: list[Instance] = field(default_factory=list)
    test: list[Instance] = field(default_factory=list)
    unknown_languages: tuple[str, ...] = ()  # language fields the file lacks (kept as English)

    def query(self, instance: Instance, query: str = "definition") -> str:
        return user_turn(self.definition, instance.input, query)

    def examples(self, instances: list[Instance] | None = None, query: str = "definition") -> list[Example]:
        """Training examples (the training set by default): the user turn answered by the first output."""
        chosen = self.train if instances is None else instances
        return [Example(self.query(i, query), (Step(self.name, i.reference),), id=i.id or None) for i in chosen]


@dataclass
class TaskFile:
    path: Path
    number: int
    definition: str
    languages: dict[str, list[str] | None]  # None: the file lacks the field
    instances: list[Instance]

    @property
    def unknown_languages(self) -> tuple[str, ...]:
        return tuple(key for key, value in self.languages.items() if value is None)

    @property
    def english(self) -> bool:
        """Every language the file states is exactly English (a missing field does not count against it)."""
        return all(value == ["English"] for value in self.languages.values() if value is not None)


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
    definition = data.get("Definition")
    if isinstance(definition, str) and definition.strip():
        definition = [definition]  # the older layout
    definition = _strings(definition, "Definition", path)
    languages = {key: None if key not in data else _strings(data[key], key, path) for key in LANGUAGE_FIELDS}
    instances = data.get("Instances")
    if not isinstance(instances, list) or not instances:
        raise DataError(f"{path}: field 'Instances': missing or empty (must be a non-empty list)")
    parsed = [_instance(item, path, k) for k, item in enumerate(instances)]
    return TaskFile(path, number, " ".join(definition), languages, parsed)


def _strings(value, key: str, path: Path) -> list[str]:
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
    return Instance(str(item.get("id") or ""), text, tuple(outputs))


def reference_order(instances: list[Instance]) -> list[Instance]:
    """The instances sorted by the MD5 of ``id||input||output[0]`` (the reference code's stable split order)."""

    def rank(instance: Instance) -> int:
        key = f"{instance.id}||{instance.input}||{instance.reference}"
        return stable_hash(key)

    return sorted(instances, key=rank)


def load_tasks(
    tasks_dir,
    num_tasks: int | None = None,
    train_per_task: int = 500,
    test_per_task: int = 50,
    min_train: int | None = None,
) -> tuple[list[Task], list[dict]]:
    """The first ``num_tasks`` usable English tasks in ascending task-id order, split into test and train.

    A task is usable when it has at least ``test_per_task + min_train`` instances (``min_train``
    defaults to ``train_per_task``: every task gets its full training set); it trains on up to
    ``train_per_task``.  Returns the tasks and the skipped files, each ``{"file", "reason"}``.
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
            tasks.append(_split(task, train_per_task, test_per_task))
    return tasks, skipped


def _unusable(task: TaskFile, needed: int) -> str | None:
    if not task.english:
        stated = {k: v for k, v in task.languages.items() if v is not None}
        return "not English (" + ", ".join(f"{k}={v}" for k, v in stated.items()) + ")"
    if len(task.instances) < needed:
        return f"only {len(task.instances)} instances ({needed} needed)"
    return None


def _split(task: TaskFile, train_per_task: int, test_per_task: int) -> Task:
    ranked = reference_order(task.instances)
    return Task(
        name=task.path.stem,
        number=task.number,
        definition=task.definition,
        test=ranked[:test_per_task],
        train=ranked[test_per_task : test_per_task + train_per_task],
        unknown_languages=task.unknown_languages,
    )
