"""The atomic-recall study on the tiny-random backbone: every method through one harness, its files,
resuming after a crash, and the baselines' own contracts (LoRA leaves the backbone alone, replay mixes
20%, RAG's retrieval accuracy)."""

import json
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from tokmem import Example, Step
from tokmem.baselines.common import Answer, Method
from tokmem.baselines.lora import LoRA, Replay
from tokmem.baselines.memory import TokMem
from tokmem.baselines.rag import RAG
from tokmem.cli import main
from tokmem.data.sni import Instance, Task
from tokmem.errors import TokMemError
from tokmem.experiments.atomic import METHODS, AtomicConfig, evaluate, learn_round, make_config, run_atomic, run_sample_efficiency
from tokmem.experiments.outputs import read_json
from tokmem.layout import collate, encode

TASKS = {
    "task001_upper": [(w, w.upper()) for w in ("apple", "house", "table", "chair", "green", "water")],
    "task002_reverse": [(w, w[::-1]) for w in ("stone", "light", "river", "cloud", "bread", "plant")],
    "task010_add": [(f"{a} + {b}", str(a + b)) for a, b in ((1, 2), (3, 4), (5, 6), (7, 8), (2, 9), (4, 4))],
}
NAMES = list(TASKS)


@pytest.fixture(scope="module")
def sni_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sni")
    for name, pairs in TASKS.items():
        languages = {key: ["English"] for key in ("Input_language", "Output_language", "Instruction_language")}
        instances = [{"id": f"{name}-{i}", "input": q, "output": [a]} for i, (q, a) in enumerate(pairs)]
        (folder / f"{name}.json").write_text(json.dumps({"Definition": [name], **languages, "Instances": instances}))
    return folder


@pytest.fixture(scope="module")
def config(sni_dir):
    return AtomicConfig(
        tasks_dir=str(sni_dir), train_per_task=4, test_per_task=2, checkpoints=(2, 3), backbone="tiny-random",
        max_new_tokens=4, eval_batch_size=8, replay_buffer=3, replay_every=1, device="cpu",
    )


@pytest.fixture(scope="module")
def study(config, backbone, tmp_path_factory):
    """Every method through the harness, uninterrupted: (result, its JSON path)."""
    path = tmp_path_factory.mktemp("study") / "atomic.json"
    return run_atomic(config, backbone, path, progress=False), path


def lora_params(backbone, rank):
    return sum(rank * (m.in_features + m.out_features) for n, m in backbone.model.named_modules() if n.endswith(("q_proj", "v_proj")))


def words(task, count):
    return [Example(f"{task} {i}", (Step(task, f"answer {i}"),), id=f"{task}-{i}") for i in range(count)]


def test_every_method_reports_rouge_its_accuracy_and_its_parameters_at_every_checkpoint(study, backbone):
    result, _ = study
    assert [p["num_tasks"] for p in result["checkpoints"]] == [2, 3]
    for point in result["checkpoints"]:
        n, methods = point["num_tasks"], point["methods"]
        assert list(methods) == list(METHODS)
        for scores in methods.values():
            assert list(scores["per_task"]) == NAMES[:n]
            assert scores["rougeL"] == pytest.approx(sum(s["rougeL"] for s in scores["per_task"].values()) / n)
            assert 0.0 <= scores["rougeL"] <= 100.0
        assert 0.0 <= methods["tokmem"]["routing_accuracy"] <= 1.0 and 0.0 <= methods["tokmem-dc"]["routing_accuracy"] <= 1.0
        assert 0.0 <= methods["rag"]["retrieval_accuracy"] <= 1.0
        assert not {"routing_accuracy", "retrieval_accuracy"} & set(methods["base"] | methods["lora"] | methods["replay"])
        params = {name: scores["trainable_params"] for name, scores in methods.items()}
        hidden = backbone.hidden_size
        assert params == {"base": 0, "rag": 0, "lora": lora_params(backbone, 8), "replay": lora_params(backbone, 8),
                          "tokmem": n * hidden, "tokmem-dc": 2 * n * hidden}


def test_the_json_on_disk_is_the_result_with_its_config_tasks_and_machine(study):
    result, path = study
    saved = read_json(path)
    assert saved == json.loads(json.dumps(result))
    assert saved["config"]["checkpoints"] == [2, 3] and saved["config"]["lora_rank"] == 8
    assert [t["name"] for t in saved["tasks"]] == NAMES and saved["machine"]["torch"]


def test_a_markdown_table_in_the_paper_layout_and_a_png_plot_are_written(study):
    _, path = study
    table = path.with_suffix(".md").read_text()
    assert "| Method | 2 | 3 | Avg. | Trainable params |" in table
    for label in ("Base", "RAG", "Fine-tuning", "Replay Memory", "TokMem", "TokMem+DC"):
        assert f"\n| {label} | " in table
    assert "| RAG (retrieval) |" in table and "| TokMem (routing) |" in table
    assert path.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_crash_keeps_the_finished_checkpoint_and_resume_ends_where_an_uninterrupted_run_does(config, backbone, study, tmp_path, monkeypatch):
    config = replace(config, methods=("rag", "replay", "tokmem"))
    path = tmp_path / "atomic.json"
    learn = TokMem.learn

    def crash_on_the_third_task(self, examples):
        if len(self.model.bank) == 2:
            raise RuntimeError("simulated crash")
        learn(self, examples)

    monkeypatch.setattr(TokMem, "learn", crash_on_the_third_task)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_atomic(config, backbone, path, progress=False)
    crashed = read_json(path)
    assert [p["num_tasks"] for p in crashed["checkpoints"]] == [2]
    monkeypatch.undo()

    resumed = run_atomic(config, backbone, path, resume=True, progress=False)
    assert resumed["checkpoints"][0] == crashed["checkpoints"][0]  # not redone: even its timings are the saved ones
    uninterrupted, full_path = study
    for name in config.methods:
        assert resumed["checkpoints"][1]["methods"][name]["per_task"] == uninterrupted["checkpoints"][1]["methods"][name]["per_task"]
    here, there = tmp_path / "atomic-state" / "3", full_path.parent / "atomic-state" / "3"
    for file in ("replay/adapter.safetensors", "tokmem/bank.safetensors"):
        mine, theirs = load_file(here / file), load_file(there / file)
        assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert json.loads((here / "replay/state.json").read_text()) == json.loads((there / "replay/state.json").read_text())


def test_resuming_with_other_settings_is_refused(config, backbone, study):
    _, path = study
    with pytest.raises(TokMemError, match="other settings \\(test_per_task\\)"):
        run_atomic(replace(config, test_per_task=1), backbone, path, resume=True, progress=False)


def test_lora_trains_its_adapters_but_leaves_the_shared_backbone_bit_identical(lively_backbone):
    model = lively_backbone.model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    modules = [(name, type(m)) for name, m in model.named_modules()]
    examples = words("echo", 8)
    method = LoRA(lively_backbone, lr=0.05, epochs=4)
    initial = {k: v.clone() for k, v in method.weights.items()}
    method.learn(examples)
    method.answer(["echo 3"])

    tokenizer = lively_backbone.tokenizer
    batch = collate([encode(e, tokenizer, None, 1024) for e in examples], tokenizer.pad_token_id)
    with torch.no_grad():
        plain = method.model.loss(batch)[0]
        with method.attached():
            adapted = method.model.loss(batch)[0]
    assert adapted < plain  # the adapters learned the examples and are live while attached
    assert any(not torch.equal(initial[k], method.weights[k]) for k in initial)
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert [(name, type(m)) for name, m in model.named_modules()] == modules
    assert not any(p.requires_grad for p in model.parameters()) and not hasattr(model, "peft_config")


def test_replay_adds_one_buffered_example_to_every_batch_of_four_new_ones(backbone):
    replay = Replay(backbone, ratio=0.2, buffer_size=6, refresh_every=1)
    first, second = words("first", 8), words("second", 8)
    assert [len(b) for b in replay.batches(first)] == [4, 4]  # nothing buffered yet: plain fine-tuning
    replay.remember(first)
    batches = replay.batches(second)
    assert [len(b) for b in batches] == [5, 5]
    replayed = [e for b in batches for e in b if e.procedures == ["first"]]
    assert len(replayed) / sum(map(len, batches)) == 0.2
    assert [e.id for b in batches for e in b[:4]] == [e.id for b in replay.batches(second) for e in b[:4]]
    assert sorted(e.id for b in batches for e in b[:4]) == sorted(e.id for e in second)  # the new ones, each once


def test_the_replay_buffer_is_refreshed_every_k_procedures_from_all_examples_seen(backbone):
    replay = Replay(backbone, buffer_size=5, refresh_every=2)
    a, b, c = words("a", 4), words("b", 4), words("c", 4)
    replay.remember(a)
    assert replay.buffer == []
    replay.remember(b)
    assert len(replay.buffer) == 5 and set(replay.buffer) <= set(a + b)
    refreshed = list(replay.buffer)
    replay.remember(c)
    assert replay.buffer == refreshed  # three procedures: not yet the next refresh
    assert replay.seen == 12 and len(replay.reservoir) == 5


def test_retrieval_accuracy_is_the_share_of_queries_whose_nearest_training_example_is_from_their_task(backbone):
    weather = Task("task001_weather", 1, "", train=[Instance("w1", "Will it rain in Paris tomorrow?", ("yes",)),
                                                    Instance("w2", "Is it sunny in Rome today?", ("no",))],
                   test=[Instance("w3", "Will it rain in London tomorrow?", ("yes",)),
                         Instance("w4", "Is it sunny in Madrid today?", ("no",))])
    math = Task("task002_math", 2, "", train=[Instance("m1", "What is 12 plus 30?", ("42",)), Instance("m2", "What is 7 times 6?", ("42",))],
                test=[Instance("m3", "What is 5 plus 9?", ("14",)),
                      Instance("m4", "Is it sunny in Rome today?", ("4",))])  # worded as a weather example: retrieval misses it
    rag = RAG(backbone, k=1, max_new_tokens=2)
    for task in (weather, math):
        rag.learn(task.examples())
    assert [[e.id for e in shots] for shots in rag.retrieve(["Is it sunny in Rome today?", "What is 5 plus 9?"])] == [["w2"], ["m1"]]
    result = evaluate(rag, [weather, math])
    assert result["per_task"]["task001_weather"]["retrieval_accuracy"] == 1.0
    assert result["per_task"]["task002_math"]["retrieval_accuracy"] == 0.5
    assert result["retrieval_accuracy"] == 0.75


class Lookup(Method):
    """Answers from a fixed table: the harness's scoring is what is under test."""

    name, label = "lookup", "Lookup"

    def __init__(self, answers):
        self.answers = answers

    def answer(self, queries):
        return [Answer(self.answers[q]) for q in queries]


def test_rouge_l_takes_the_best_reference_and_averages_per_task_then_over_tasks():
    one = Task("task001_one", 1, "", test=[Instance("a", "q1", ("wrong words", "right answer")), Instance("b", "q2", ("right answer",))])
    two = Task("task002_two", 2, "", test=[Instance("c", "q3", ("right answer",))])
    result = evaluate(Lookup({"q1": "right answer", "q2": "nothing alike", "q3": "right answer"}), [one, two], batch_size=1)
    assert result["per_task"]["task001_one"]["rougeL"] == pytest.approx(50.0)
    assert result["per_task"]["task002_two"]["rougeL"] == pytest.approx(100.0)
    assert result["rougeL"] == pytest.approx(75.0)


def test_sample_efficiency_trains_fresh_methods_per_budget_and_drops_budgets_the_data_lacks(config, backbone, tmp_path):
    efficiency = replace(config, sample_efficiency=True, budgets=(2, 4, 100), methods=("rag", "lora", "tokmem"))
    result = run_sample_efficiency(efficiency, backbone, tmp_path / "efficiency.json", progress=False)
    assert [p["train_per_task"] for p in result["budgets"]] == [2, 4] and result["dropped_budgets"] == [100]
    assert result["config"]["lora_rank"] == 1
    for point in result["budgets"]:
        methods = point["methods"]
        assert list(methods) == ["rag", "lora", "tokmem"]
        assert methods["lora"]["trainable_params"] == lora_params(backbone, 1)
        assert methods["tokmem"]["trainable_params"] == 3 * backbone.hidden_size  # one bank per budget
    assert "| Method | 2 | 4 | Avg. | Trainable params |" in (tmp_path / "efficiency.md").read_text()


def test_presets_give_the_sizes_and_options_override_them(tmp_path):
    paper = make_config("paper", tasks_dir=str(tmp_path)).resolved()
    assert (paper.train_per_task, paper.test_per_task, paper.checkpoints, paper.num_tasks) == (500, 50, (10, 50, 200, 500, 1000), 1000)
    cpu = make_config("cpu", checkpoints=(1, 2), methods=("base",)).resolved()
    assert (cpu.train_per_task, cpu.test_per_task, cpu.num_tasks, cpu.methods, cpu.lora_rank) == (20, 8, 2, ("base",), 8)
    with pytest.raises(TokMemError, match="unknown method"):
        make_config("cpu", methods=("base", "magic")).resolved()


def test_bench_atomic_command_writes_the_json_table_and_plot(sni_dir, tmp_path):
    path = tmp_path / "out.json"
    assert main(["bench", "atomic", "--tasks-dir", str(sni_dir), "--backbone", "tiny-random", "--device", "cpu",
                 "--methods", "base,tokmem", "--train-per-task", "4", "--test-per-task", "2", "--checkpoints", "1,3",
                 "--max-new-tokens", "3", "--tokmem-lr", "0.02", "--quiet", "--json", str(path)]) == 0
    result = read_json(path)
    assert result["config"]["tokmem_lr"] == 0.02
    assert [p["num_tasks"] for p in result["checkpoints"]] == [1, 3]
    assert list(result["checkpoints"][1]["methods"]) == ["base", "tokmem"]
    assert path.with_suffix(".md").is_file() and path.with_suffix(".png").is_file()


def test_bench_atomic_refuses_a_checkpoint_beyond_the_tasks_found(sni_dir, tmp_path, capsys):
    assert main(["bench", "atomic", "--tasks-dir", str(sni_dir), "--backbone", "tiny-random", "--train-per-task", "4",
                 "--test-per-task", "2", "--checkpoints", "2,5", "--json", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert "checkpoint 5 needs 5 tasks" in err and "Traceback" not in err


class RecordingBar:
    """The two calls ``learn_round`` makes on a tqdm bar, recorded."""

    def __init__(self):
        self.updates = []

    def set_description_str(self, text):
        pass

    def update(self, n):
        self.updates.append(n)


@pytest.mark.parametrize("make", [
    lambda backbone: LoRA(backbone, epochs=2, batch_size=2, max_length=32),
    lambda backbone: TokMem(backbone, epochs=2, batch_size=2, max_length=32),
], ids=["lora", "tokmem"])
def test_learn_round_advances_the_bar_after_every_step_of_the_round(make, backbone, examples):
    method, bar = make(backbone), RecordingBar()
    learn_round(method, examples, "a round", bar)
    steps = -(-2 * len(examples) // 2)
    assert len([n for n in bar.updates if n > 0]) == steps
    assert sum(bar.updates) == 2 * len(examples) and method.on_step is None
