"""The SNI task loader: every upstream layout, task-id order, English filter, the reference split, the user turn, clear errors."""

import hashlib
import json
import random
import shutil
from pathlib import Path

import pytest

from tokmem.data.sni import load_tasks, read_task
from tokmem.errors import DataError

SNI_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "sni" / "tasks"
LAYOUTS = Path(__file__).resolve().parent / "data" / "sni_layouts"  # task901: today's layout; task902: an older one
ENGLISH = {key: ["English"] for key in ("Input_language", "Output_language", "Instruction_language")}

needs_sni = pytest.mark.skipif(not SNI_DIR.is_dir(), reason=f"{SNI_DIR} is absent")


def write_task(folder: Path, name: str, instances: int = 6, **fields) -> Path:
    data = {
        "Definition": [f"Definition of {name}."],
        **ENGLISH,
        "Instances": [
            {"id": f"{name}-{i}", "input": f"{name} input {i}", "output": [f"out {i}", f"alt {i}"]}
            for i in range(instances)
        ],
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


def md5_rank(item: dict) -> int:
    return int(hashlib.md5(f"{item.get('id', '')}||{item['input']}||{item['output'][0]}".encode()).hexdigest(), 16)


def test_the_split_is_the_md5_order_of_id_input_first_output_test_first_then_train(tmp_path):
    path = write_task(tmp_path, "task1_a", instances=12)
    items = json.loads(path.read_text())["Instances"]
    ranked = [item["id"] for item in sorted(items, key=md5_rank)]
    assert ranked != [item["id"] for item in items]  # the file order is not the md5 order: the test can fail
    task = load_tasks(tmp_path, train_per_task=5, test_per_task=3)[0][0]
    assert [i.id for i in task.test] == ranked[:3] and [i.id for i in task.train] == ranked[3:8]


def test_the_split_depends_neither_on_the_order_of_the_file_nor_on_the_training_budget(tmp_path):
    first, second = tmp_path / "one", tmp_path / "two"
    first.mkdir(), second.mkdir()
    path = write_task(first, "task1_a", instances=12)
    data = json.loads(path.read_text())
    random.Random(3).shuffle(data["Instances"])
    (second / path.name).write_text(json.dumps(data))
    big = load_tasks(first, train_per_task=8, test_per_task=3)[0][0]
    small = load_tasks(second, train_per_task=2, test_per_task=3)[0][0]
    assert small.test == big.test and small.train == big.train[:2]


@needs_sni
def test_real_split_is_stable_and_its_test_set_does_not_depend_on_the_training_budget():
    first, _ = load_tasks(SNI_DIR, num_tasks=3, train_per_task=20, test_per_task=8)
    again, _ = load_tasks(SNI_DIR, num_tasks=3, train_per_task=10, test_per_task=8)
    assert [t.test for t in first] == [t.test for t in again]
    assert [t.train[:10] for t in first] == [t.train for t in again]


def test_the_user_turn_is_the_definition_a_blank_line_and_the_input_or_the_input_alone():
    task = load_tasks(LAYOUTS, num_tasks=1, train_per_task=3, test_per_task=1)[0][0]
    instance = task.train[0]
    assert (
        task.query(instance)
        == task.query(instance, "definition")
        == f"Given a word, write it in capital letters.\n\n{instance.input}"
    )
    assert task.query(instance, "input") == instance.input
    for mode in ("definition", "input"):
        example = task.examples(query=mode)[0]
        assert example.query == task.query(instance, mode)
        assert example.procedures == [task.name] and example.response == instance.outputs[0]
    with pytest.raises(DataError, match="unknown query mode 'both'"):
        task.query(instance, "both")


def test_both_released_layouts_load_the_older_one_with_its_languages_unknown():
    tasks, skipped = load_tasks(LAYOUTS, train_per_task=3, test_per_task=1)
    assert skipped == [] and [t.name for t in tasks] == ["task901_current_layout", "task902_older_layout"]
    current, older = tasks
    assert current.definition == "Given a word, write it in capital letters." and current.unknown_languages == ()
    assert older.definition == "Given a word, write it backwards."  # given as a plain string
    assert older.unknown_languages == ("Input_language", "Output_language", "Instruction_language")
    assert sorted(i.input for i in older.train + older.test) == ["apple", "house", "river", "stone"]
    assert {i.id for i in older.train + older.test} == {
        "task902-a",
        "task902-b",
        "",
        "task902-d",
    }  # one instance has no id


def test_a_stated_foreign_language_is_skipped_even_when_other_fields_are_missing(tmp_path):
    for name in ("task901_current_layout", "task902_older_layout"):
        shutil.copy(LAYOUTS / f"{name}.json", tmp_path)
    data = json.loads((tmp_path / "task902_older_layout.json").read_text())
    (tmp_path / "task903_spanish.json").write_text(json.dumps(data | {"Output_language": ["Spanish"]}))
    tasks, skipped = load_tasks(tmp_path, train_per_task=3, test_per_task=1)
    assert [t.name for t in tasks] == ["task901_current_layout", "task902_older_layout"]
    assert skipped == [{"file": "task903_spanish.json", "reason": "not English (Output_language=['Spanish'])"}]


def test_a_task_trains_on_up_to_train_per_task_and_fewer_when_its_file_has_fewer(tmp_path):
    write_task(tmp_path, "task1_big", instances=12)
    write_task(tmp_path, "task2_small", instances=6)
    write_task(tmp_path, "task3_tiny", instances=4)
    tasks, skipped = load_tasks(tmp_path, train_per_task=8, test_per_task=2, min_train=3)
    assert [(t.name, len(t.test), len(t.train)) for t in tasks] == [("task1_big", 2, 8), ("task2_small", 2, 4)]
    assert skipped == [{"file": "task3_tiny.json", "reason": "only 4 instances (5 needed)"}]


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
        (
            json.dumps({"Definition": "", **ENGLISH, "Instances": [{"input": "x", "output": ["y"]}]}),
            "field 'Definition'",
        ),
        (
            json.dumps(
                {"Definition": ["d"], "Input_language": "English", "Instances": [{"input": "x", "output": ["y"]}]}
            ),
            "field 'Input_language'",
        ),
        (json.dumps({"Definition": ["d"], **ENGLISH, "Instances": []}), "field 'Instances'"),
        (
            json.dumps(
                {
                    "Definition": ["d"],
                    **ENGLISH,
                    "Instances": [{"input": "x", "output": ["y"]}, {"input": 3, "output": ["y"]}],
                }
            ),
            "field 'Instances[1].input'",
        ),
        (
            json.dumps({"Definition": ["d"], **ENGLISH, "Instances": [{"input": "x", "output": "y"}]}),
            "field 'Instances[0].output'",
        ),
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
