"""The SNI task loader: real upstream files, task-id order, English filter, fixed split, clear errors."""

import json
from pathlib import Path

import pytest

from tokmem.data.sni import load_tasks, read_task
from tokmem.errors import DataError

SNI_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "sni" / "tasks"
ENGLISH = {key: ["English"] for key in ("Input_language", "Output_language", "Instruction_language")}

needs_sni = pytest.mark.skipif(not SNI_DIR.is_dir(), reason=f"{SNI_DIR} is absent")


def write_task(folder: Path, name: str, instances: int = 6, **fields) -> Path:
    data = {
        "Definition": [f"Definition of {name}."],
        **ENGLISH,
        "Instances": [{"id": f"{name}-{i}", "input": f"{name} input {i}", "output": [f"out {i}", f"alt {i}"]} for i in range(instances)],
    }
    data.update(fields)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@needs_sni
def test_real_task_files_load_in_ascending_task_id_order_with_disjoint_splits():
    tasks, skipped = load_tasks(SNI_DIR, train_per_task=20, test_per_task=8)
    numbers = [t.number for t in tasks]
    assert len(tasks) == len(list(SNI_DIR.glob("task*.json"))) - len(skipped) >= 14
    assert numbers == sorted(numbers) and numbers[:2] == [88, 195]  # numeric order: 88 before 195 before 1087
    for task in tasks:
        assert (len(task.train), len(task.test)) == (20, 8)
        assert not {i.id for i in task.train} & {i.id for i in task.test}
        assert task.definition and all(i.outputs for i in task.test)


@needs_sni
def test_real_split_is_fixed_by_the_seed_and_the_test_set_does_not_depend_on_the_training_budget():
    first, _ = load_tasks(SNI_DIR, num_tasks=3, train_per_task=20, test_per_task=8)
    again, _ = load_tasks(SNI_DIR, num_tasks=3, train_per_task=10, test_per_task=8)
    other, _ = load_tasks(SNI_DIR, num_tasks=3, train_per_task=20, test_per_task=8, seed=1)
    assert [t.test for t in first] == [t.test for t in again]
    assert [t.train[:10] for t in first] == [t.train for t in again]
    assert [t.test for t in first] != [t.test for t in other]


@needs_sni
def test_training_examples_are_the_instance_input_alone_answered_by_the_first_output():
    task = load_tasks(SNI_DIR, num_tasks=1, train_per_task=4, test_per_task=2)[0][0]
    example = task.examples()[0]
    assert example.query == task.train[0].input
    assert example.procedures == [task.name] and example.response == task.train[0].outputs[0]


def test_tasks_are_ordered_by_task_number_not_by_file_name(tmp_path):
    for name in ("task10_b", "task2_a", "task1_c"):
        write_task(tmp_path, name)
    tasks, _ = load_tasks(tmp_path, train_per_task=3, test_per_task=2)
    assert [t.name for t in tasks] == ["task1_c", "task2_a", "task10_b"]


def test_non_english_and_too_small_tasks_are_skipped_with_a_reason(tmp_path):
    write_task(tmp_path, "task1_en")
    write_task(tmp_path, "task2_de", Input_language=["German"])
    write_task(tmp_path, "task3_small", instances=3)
    write_task(tmp_path, "task4_en")
    tasks, skipped = load_tasks(tmp_path, train_per_task=3, test_per_task=2)
    assert [t.name for t in tasks] == ["task1_en", "task4_en"]
    assert [s["file"] for s in skipped] == ["task2_de.json", "task3_small.json"]
    assert "not English" in skipped[0]["reason"] and "only 3 instances (5 needed)" in skipped[1]["reason"]


def test_num_tasks_takes_the_first_usable_tasks_and_min_train_relaxes_the_size_rule(tmp_path):
    write_task(tmp_path, "task1_a", instances=4)
    write_task(tmp_path, "task2_b", instances=8)
    write_task(tmp_path, "task3_c", instances=8)
    tasks, _ = load_tasks(tmp_path, num_tasks=1, train_per_task=5, test_per_task=2)
    assert [t.name for t in tasks] == ["task2_b"]
    tasks, _ = load_tasks(tmp_path, train_per_task=5, test_per_task=2, min_train=2)
    assert [len(t.train) for t in tasks] == [2, 5, 5]


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "not a valid JSON file"),
        (json.dumps({**ENGLISH, "Instances": [{"input": "x", "output": ["y"]}]}), "field 'Definition'"),
        (json.dumps({"Definition": ["d"], "Input_language": ["English"], "Instances": [{"input": "x", "output": ["y"]}]}), "field 'Output_language'"),
        (json.dumps({"Definition": ["d"], **ENGLISH, "Instances": []}), "field 'Instances'"),
        (json.dumps({"Definition": ["d"], **ENGLISH, "Instances": [{"input": "x", "output": ["y"]}, {"input": 3, "output": ["y"]}]}), "field 'Instances[1].input'"),
        (json.dumps({"Definition": ["d"], **ENGLISH, "Instances": [{"input": "x", "output": "y"}]}), "field 'Instances[0].output'"),
    ],
)
def test_a_malformed_task_file_is_an_error_naming_the_file_and_the_field(tmp_path, content, message):
    path = tmp_path / "task7_broken.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match="task7_broken.json") as error:
        load_tasks(tmp_path, train_per_task=1, test_per_task=1)
    assert message in str(error.value)


def test_a_missing_folder_or_an_oddly_named_task_file_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="SNI tasks folder not found"):
        load_tasks(tmp_path / "nowhere")
    with pytest.raises(DataError, match="no taskNNN_name.json files"):
        load_tasks(tmp_path)
    (tmp_path / "task_x.json").write_text("{}")
    with pytest.raises(DataError, match="task_x.json: not an SNI task file name"):
        read_task(tmp_path / "task_x.json")
