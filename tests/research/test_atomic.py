"""The atomic-recall study on the tiny-random backbone: every method through one harness in both schedules
and both query modes, its files, resuming after a crash, the reference scoring, and the baselines' own
contracts (LoRA leaves the backbone alone, replay mixes 20%, RAG's retrieval accuracy)."""

import copy
import json
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tokmem import Example, Step
from tokmem.backbones import Backbone
from tokmem.decoding.decode import DecodeConfig
from tokmem.training.lora import LoRASettings
from research.methods.base import Base
from research.methods.method import Answer, Method, first_block, plain_answers
from research.methods.lora import LoRA, Replay, ReplaySettings
from research.methods.tokmem import TokMem
from research.methods.rag import RAG, demonstration_prompt
from research.methods.tools import ToolRAG, tool_prompt
from tokmem.data.tool_catalog import catalog, split_tools
from research.cli import main
from tokmem.data.sni import Instance, Task, load_tasks
from tokmem.errors import TokMemError
from research.studies.atomic import evaluate, run_atomic, run_sample_efficiency
from research.studies.atomic_config import JOINT_METHODS, METHODS, AtomicConfig, make_config
from tokmem.io import read_json
from research.studies.harness import learn_round
from tokmem.training.sequences import collate, encode
from tokmem.training.train import TrainConfig
from tokmem.training.loss import batch_loss

TASKS = {
    "task001_upper": [(w, w.upper()) for w in ("apple", "house", "table", "chair", "green", "water")],
    "task002_reverse": [(w, w[::-1]) for w in ("stone", "light", "river", "cloud", "bread", "plant")],
    "task010_add": [(f"{a} + {b}", str(a + b)) for a, b in ((1, 2), (3, 4), (5, 6), (7, 8), (2, 9), (4, 4))],
}
NAMES = list(TASKS)
LAYOUTS = Path(__file__).resolve().parents[1] / "data" / "sni_layouts"


@pytest.fixture(scope="module")
def sni_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sni")
    for name, pairs in TASKS.items():
        languages = {key: ["English"] for key in ("Input_language", "Output_language", "Instruction_language")}
        instances = [{"id": f"{name}-{i}", "input": q, "output": [a]} for i, (q, a) in enumerate(pairs)]
        (folder / f"{name}.json").write_text(
            json.dumps({"Definition": [f"Do {name}."], **languages, "Instances": instances})
        )
    return folder


SMALL = dict(
    train_per_task=4,
    test_per_task=2,
    checkpoints=(2, 3),
    backbone="tiny-random",
    max_new_tokens=4,
    eval_batch_size=8,
    replay_buffer=3,
    replay_every=1,
    device="cpu",
)


@pytest.fixture(scope="module")
def config(sni_dir):
    """The sequential schedule (tasks arrive one at a time), every method."""
    return make_config(None, tasks_dir=str(sni_dir), task_schedule="sequential", **SMALL)


@pytest.fixture(scope="module")
def study(config, backbone, tmp_path_factory):
    """Every method through the harness, uninterrupted: (result, its JSON path)."""
    path = tmp_path_factory.mktemp("study") / "atomic.json"
    return run_atomic(config, backbone, path, progress=False), path


def lora_params(backbone, rank):
    return sum(
        rank * (m.in_features + m.out_features)
        for n, m in backbone.model.named_modules()
        if n.endswith(("q_proj", "v_proj"))
    )


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
        assert (
            0.0 <= methods["tokmem"]["routing_accuracy"] <= 1.0
            and 0.0 <= methods["tokmem-dc"]["routing_accuracy"] <= 1.0
        )
        assert 0.0 <= methods["rag"]["retrieval_accuracy"] <= 1.0
        assert not {"routing_accuracy", "retrieval_accuracy"} & set(
            methods["base"] | methods["lora"] | methods["replay"]
        )
        params = {name: scores["trainable_params"] for name, scores in methods.items()}
        hidden = backbone.hidden_size
        assert params == {
            "base": 0,
            "rag": 0,
            "lora": lora_params(backbone, 8),
            "replay": lora_params(backbone, 8),
            "tokmem": n * hidden,
            "tokmem-dc": 2 * n * hidden,
        }


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
    assert (
        "query = the task definition, a blank line, the instance input (the paper's protocol); schedule = sequential"
        in table
    )
    assert "ROUGE-L against output[0], Porter-stemmed" in table and "TokMem lr 0.005, mean init" in table
    assert "3 tasks from" in table and "2 test and up to 4 training examples per task." in table
    assert path.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_crash_keeps_the_finished_checkpoint_and_resume_ends_where_an_uninterrupted_run_does(
    config, backbone, study, tmp_path, monkeypatch
):
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
        after, before = resumed["checkpoints"][1]["methods"][name], uninterrupted["checkpoints"][1]["methods"][name]
        assert (after["per_task"], after["updates"]) == (before["per_task"], before["updates"])
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
    method = LoRA(lively_backbone, TrainConfig(epochs=4), LoRASettings(lr=0.05))
    initial = {k: v.clone() for k, v in method.adapter.weights.items()}
    method.learn(examples)
    method.answer(["echo 3"])

    tokenizer = lively_backbone.tokenizer
    batch = collate([encode(e, tokenizer, None, 1024) for e in examples], tokenizer.pad_token_id)
    with torch.no_grad():
        plain = batch_loss(method.model, batch)[0]
        with method.attached():
            adapted = batch_loss(method.model, batch)[0]
    assert adapted < plain  # the adapters learned the examples and are live while attached
    assert any(not torch.equal(initial[k], method.adapter.weights[k]) for k in initial)
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert [(name, type(m)) for name, m in model.named_modules()] == modules
    assert not any(p.requires_grad for p in model.parameters()) and not hasattr(model, "peft_config")


def test_replay_adds_one_buffered_example_to_every_batch_of_four_new_ones(backbone):
    replay = Replay(backbone, ReplaySettings(ratio=0.2, buffer_size=6, refresh_every=1))
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
    replay = Replay(backbone, ReplaySettings(buffer_size=5, refresh_every=2))
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
    weather = Task(
        "task001_weather",
        1,
        "",
        train=[
            Instance("w1", "Will it rain in Paris tomorrow?", ("yes",)),
            Instance("w2", "Is it sunny in Rome today?", ("no",)),
        ],
        test=[
            Instance("w3", "Will it rain in London tomorrow?", ("yes",)),
            Instance("w4", "Is it sunny in Madrid today?", ("no",)),
        ],
    )
    math = Task(
        "task002_math",
        2,
        "",
        train=[Instance("m1", "What is 12 plus 30?", ("42",)), Instance("m2", "What is 7 times 6?", ("42",))],
        test=[Instance("m3", "What is 5 plus 9?", ("14",)), Instance("m4", "Is it sunny in Rome today?", ("4",))],
    )  # worded as a weather example: retrieval misses it
    rag = RAG(backbone, k=1, decode=DecodeConfig(max_new_tokens=2))
    for task in (weather, math):
        rag.learn(task.examples(query="input"))
    assert [[e.id for e in shots] for shots in rag.retrieve(["Is it sunny in Rome today?", "What is 5 plus 9?"])] == [
        ["w2"],
        ["m1"],
    ]
    result = evaluate(rag, [weather, math], query="input")
    assert result["per_task"]["task001_weather"]["retrieval_accuracy"] == 1.0
    assert result["per_task"]["task002_math"]["retrieval_accuracy"] == 0.5
    assert result["retrieval_accuracy"] == 0.75


@pytest.fixture(scope="module")
def blank_line_backbone(lively_backbone):
    """lively tiny-random with the newline's (tied) row tripled: its answers often have a blank line after some text."""
    model = copy.deepcopy(lively_backbone.model)
    newline = lively_backbone.tokenizer("\n", add_special_tokens=False).input_ids[-1]
    with torch.no_grad():
        model.get_output_embeddings().weight[newline].mul_(3)
    return Backbone("tiny-random-blank-lines", model, lively_backbone.tokenizer)


@pytest.mark.parametrize("kind", ["atomic", "tool"])
def test_every_rag_baseline_ends_its_answer_at_the_first_blank_line(blank_line_backbone, kind):
    """One stop rule for the prompted baselines: the answer is the unstopped decoding's text up to its first blank line."""
    queries = [f"Input: {word} {i}" for i in range(6) for word in ("rain", "sums")]
    if kind == "atomic":
        rag = RAG(blank_line_backbone, k=1, decode=DecodeConfig(max_new_tokens=32))
        rag.learn([Example("Is it sunny in Rome today?", (Step("weather", "no"),))])
        prompts = [demonstration_prompt(shots, q) for shots, q in zip(rag.retrieve(queries), queries)]
    else:
        tools = catalog(split_tools()[1][:2])
        rag = ToolRAG(blank_line_backbone, tools, k=1, shots=0, decode=DecodeConfig(max_new_tokens=32))
        prompts = [tool_prompt(tools, [], q) for tools, q in zip(rag.retrieve_tools(queries), queries)]
    whole = plain_answers(rag.model, prompts, DecodeConfig(max_new_tokens=32, batch_size=16))
    assert any("\n\n" in text.strip() for text in whole)  # the rule has something to cut
    assert [a.text for a in rag.answer(queries)] == [first_block(text) for text in whole]


class Lookup(Method):
    """Answers from a fixed table: the harness's scoring is what is under test."""

    name, label = "lookup", "Lookup"

    def __init__(self, answers):
        self.answers = answers

    def answer(self, queries):
        return [Answer(self.answers[q]) for q in queries]


def test_rouge_l_is_scored_against_the_first_output_stemmed_and_averaged_per_task_then_over_tasks():
    one = Task(
        "task001_one",
        1,
        "",
        test=[
            Instance("a", "q1", ("The cats are running", "unrelated")),
            Instance("b", "q2", ("alpha beta", "gamma delta")),
        ],
    )
    two = Task("task002_two", 2, "", test=[Instance("c", "q3", ("right answer",))])
    answers = {"q1": "the cat are run", "q2": "gamma delta", "q3": "right answer"}
    result = evaluate(Lookup(answers), [one, two], batch_size=1, query="input")
    # q1: every token matches once stemmed (cats→cat, running→run); q2: the second output is not a reference
    assert result["per_task"]["task001_one"]["rougeL"] == pytest.approx(50.0)
    assert result["per_task"]["task002_two"]["rougeL"] == pytest.approx(100.0)
    assert result["rougeL"] == pytest.approx(75.0)


def test_sample_efficiency_trains_fresh_methods_per_budget_and_drops_budgets_the_data_lacks(config, backbone, tmp_path):
    efficiency = make_config(  # made anew: the study's LoRA rank is a layer of make_config (`atomic_config.CHOSEN`)
        None,
        **SMALL | dict(tasks_dir=config.tasks_dir),
        sample_efficiency=True,
        budgets=(2, 4, 100),
        methods=("rag", "lora", "tokmem"),
    )
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
    assert (paper.train_per_task, paper.test_per_task, paper.checkpoints, paper.num_tasks) == (
        500,
        50,
        (10, 50, 200, 500, 1000),
        1000,
    )
    assert (paper.query, paper.task_schedule, paper.methods) == ("definition", "joint", JOINT_METHODS)
    cpu = make_config("cpu").resolved()
    assert (cpu.query, cpu.task_schedule, cpu.checkpoints, cpu.methods) == (
        "definition",
        "joint",
        (14,),
        ("base", "rag", "lora", "tokmem"),
    )
    assert (cpu.train_per_task, cpu.min_train_per_task, cpu.test_per_task, cpu.epochs, cpu.epoch_budgets) == (
        100,
        20,
        10,
        1,
        (1, 2),
    )
    # both learning rates raised for the preset's 263 updates, TokMem's to the paper's 5e-3 (routing at 1e-3: 51-64%)
    assert (cpu.lora_lr, cpu.tokmem_lr) == (1e-3, 5e-3)
    cpu = make_config("cpu", checkpoints=(1, 2), methods=("base",)).resolved()
    assert (cpu.num_tasks, cpu.methods, cpu.lora_rank) == (2, ("base",), 8)
    with pytest.raises(TokMemError, match="unknown method"):
        make_config("cpu", methods=("base", "magic")).resolved()


def test_each_schedule_defaults_to_its_own_recipe_and_options_override_it(tmp_path):
    joint = make_config(None, tasks_dir=str(tmp_path)).resolved()
    sequential = make_config(None, tasks_dir=str(tmp_path), task_schedule="sequential").resolved()
    assert (joint.tokmem_lr, joint.schedule, joint.methods) == (1e-3, "linear", JOINT_METHODS)  # the reference code
    assert (sequential.tokmem_lr, sequential.schedule, sequential.methods) == (
        5e-3,
        "constant",
        METHODS,
    )  # the paper's text
    assert joint.train().lr == 1e-3 and joint.train().schedule == "linear"  # fine-tuning's schedule too
    mine = make_config(None, tasks_dir=str(tmp_path), tokmem_lr=0.02, schedule="constant").resolved()
    assert (mine.tokmem_lr, mine.schedule) == (0.02, "constant")
    assert make_config(None, sample_efficiency=True).lora_rank == 1 and joint.lora_rank == 8  # the paper's ranks


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(methods=("lora", "replay")), "replay needs tasks that arrive one at a time"),
        (dict(query="both"), "unknown query 'both'"),
        (dict(task_schedule="random"), "unknown schedule 'random'"),
        (dict(task_schedule="sequential", sample_efficiency=True), "joint schedule only"),
        (dict(init="zeros"), "init must be one of mean, orthogonal"),
    ],
)
def test_settings_that_cannot_run_are_refused_before_any_work(tmp_path, options, message):
    with pytest.raises(TokMemError, match=message):
        make_config(None, tasks_dir=str(tmp_path), **options).resolved()


def test_bench_atomic_command_writes_the_json_table_and_plot(sni_dir, tmp_path):
    path = tmp_path / "out.json"
    assert (
        main(
            [
                "bench",
                "atomic",
                "--tasks-dir",
                str(sni_dir),
                "--backbone",
                "tiny-random",
                "--device",
                "cpu",
                "--methods",
                "base,tokmem",
                "--train-per-task",
                "4",
                "--test-per-task",
                "2",
                "--checkpoints",
                "1,3",
                "--max-new-tokens",
                "3",
                "--tokmem-lr",
                "0.02",
                "--query",
                "input",
                "--schedule",
                "sequential",
                "--init",
                "orthogonal",
                "--lr-schedule",
                "linear",
                "--warmup",
                "0.2",
                "--renorm-every-step",
                "--epoch-budgets",
                "2",
                "--seeds",
                "0,1",
                "--quiet",
                "--json",
                str(path),
            ]
        )
        == 0
    )
    result = read_json(path)
    recorded = {
        k: result["config"][k]
        for k in (
            "tokmem_lr",
            "query",
            "task_schedule",
            "init",
            "schedule",
            "warmup",
            "renorm_every_step",
            "epoch_budgets",
            "seeds",
        )
    }
    assert recorded == {
        "tokmem_lr": 0.02,
        "query": "input",
        "task_schedule": "sequential",
        "init": "orthogonal",
        "schedule": "linear",
        "warmup": 0.2,
        "renorm_every_step": True,
        "epoch_budgets": [2],
        "seeds": [0, 1],
    }
    assert "query = the instance input alone" in path.with_suffix(".md").read_text()
    point = result["epoch_budgets"]["2"]
    assert [p["num_tasks"] for p in point["checkpoints"]] == [1, 3] and point["seeds"] == [0, 1]
    tokmem = point["checkpoints"][1]["methods"]["tokmem"]
    assert list(point["checkpoints"][1]["methods"]) == ["base", "tokmem"] and len(tokmem["rougeL"]["per_seed"]) == 2
    assert tokmem["updates"] == 2 * sum(
        -(-t["train"] // 4) for t in point["tasks"]
    )  # 2 epochs of batches of 4, a task a round
    assert "# Budget curve" in path.with_suffix(".md").read_text() and path.with_suffix(".png").is_file()


def test_bench_atomic_refuses_a_checkpoint_beyond_the_tasks_found(sni_dir, tmp_path, capsys):
    assert (
        main(
            [
                "bench",
                "atomic",
                "--tasks-dir",
                str(sni_dir),
                "--backbone",
                "tiny-random",
                "--train-per-task",
                "4",
                "--test-per-task",
                "2",
                "--checkpoints",
                "2,5",
                "--json",
                str(tmp_path / "x.json"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "checkpoint 5 needs 5 tasks" in err and "Traceback" not in err


class RecordingBar:
    """The two calls ``learn_round`` makes on a study's bars (``PhaseBars``), recorded."""

    def __init__(self):
        self.updates = []

    def phase(self, description, total):
        self.total = total

    def update(self, n):
        self.updates.append(n)


@pytest.mark.parametrize(
    "make",
    [
        lambda backbone: LoRA(backbone, TrainConfig(epochs=2, batch_size=2, max_length=32)),
        lambda backbone: TokMem(backbone, TrainConfig(epochs=2, batch_size=2, max_length=32)),
    ],
    ids=["lora", "tokmem"],
)
def test_learn_round_advances_the_bar_after_every_step_of_the_round(make, backbone, examples):
    method, bar = make(backbone), RecordingBar()
    learn_round(method, examples, "a round", bar)
    steps = -(-2 * len(examples) // 2)
    assert len([n for n in bar.updates if n > 0]) == steps
    assert sum(bar.updates) == bar.total == 2 * len(examples) and method.on_step is None


def test_the_joint_schedule_trains_a_fresh_method_on_all_tasks_of_a_checkpoint_in_one_shuffled_round(
    config, backbone, sni_dir, tmp_path, monkeypatch
):
    rounds = []
    learn = TokMem.learn

    def recorded(self, examples):
        rounds.append((len(self.model.bank), [e.id for e in examples], [e.procedures[0] for e in examples]))
        learn(self, examples)

    monkeypatch.setattr(TokMem, "learn", recorded)
    result = run_atomic(
        make_config(None, tasks_dir=config.tasks_dir, task_schedule="joint", methods=("tokmem",), **SMALL),
        backbone,
        tmp_path / "joint.json",
        progress=False,
    )
    tasks = load_tasks(sni_dir, None, config.train_per_task, config.test_per_task)[0]
    assert len(rounds) == 2  # one round per checkpoint (2 and 3 tasks)
    for (rows_before, ids, procedures), n in zip(rounds, (2, 3)):
        assert rows_before == 0  # a fresh bank
        assert sorted(ids) == sorted(i.id for t in tasks[:n] for i in t.train)
        assert procedures != sorted(procedures, key=NAMES.index)  # shuffled together, not task after task
    assert [p["methods"]["tokmem"]["trainable_params"] for p in result["checkpoints"]] == [
        2 * backbone.hidden_size,
        3 * backbone.hidden_size,
    ]
    assert result["config"]["tokmem_lr"] == 1e-3 and result["config"]["schedule"] == "linear"
    assert "schedule = joint: one run per checkpoint" in (tmp_path / "joint.md").read_text()


@pytest.mark.parametrize("query", ["definition", "input"])
def test_every_method_learns_and_is_asked_the_same_user_turn(config, backbone, tmp_path, monkeypatch, query):
    learned, asked = defaultdict(list), defaultdict(list)
    for cls in (Base, RAG, LoRA, TokMem):

        def learn(self, examples, original=cls.learn):
            learned[self.name] += [e.query for e in examples]
            original(self, examples)

        def answer(self, queries, original=cls.answer):
            asked[self.name] += queries
            return original(self, queries)

        monkeypatch.setattr(cls, "learn", learn)
        monkeypatch.setattr(cls, "answer", answer)
    study = replace(
        config, query=query, task_schedule="joint", checkpoints=(3,), methods=("base", "rag", "lora", "tokmem")
    )
    run_atomic(study, backbone, None, progress=False)
    turn = (lambda name, text: f"Do {name}.\n\n{text}") if query == "definition" else (lambda name, text: text)
    every = {turn(name, text) for name, pairs in TASKS.items() for text, _ in pairs}
    tests = sorted(asked["tokmem"])
    assert len(tests) == 6 and set(tests) <= every
    assert all(sorted(asked[name]) == tests for name in ("base", "rag", "lora"))
    trained = sorted(learned["tokmem"])
    assert len(trained) == 12 and set(trained) <= every and not set(trained) & set(tests)
    assert all(sorted(learned[name]) == trained for name in ("rag", "lora"))


def test_a_study_on_task_files_of_both_layouts_says_which_tasks_had_no_language_fields(backbone, tmp_path):
    study = AtomicConfig(
        tasks_dir=str(LAYOUTS),
        train_per_task=3,
        test_per_task=1,
        checkpoints=(2,),
        methods=("base", "tokmem"),
        backbone="tiny-random",
        max_new_tokens=2,
        device="cpu",
    )
    result = run_atomic(study, backbone, tmp_path / "layouts.json", progress=False)
    assert result["tasks"] == [
        {"name": "task901_current_layout", "train": 3, "test": 1},
        {
            "name": "task902_older_layout",
            "train": 3,
            "test": 1,
            "unknown_languages": ["Input_language", "Output_language", "Instruction_language"],
        },
    ]
    assert (
        "kept without language fields (taken as English): task902_older_layout."
        in (tmp_path / "layouts.md").read_text()
    )


def test_a_joint_checkpoint_is_its_own_run_and_resume_redoes_only_the_unfinished_ones(
    config, backbone, tmp_path, monkeypatch
):
    joint = replace(config, task_schedule="joint", methods=("base", "tokmem"))
    alone = run_atomic(replace(joint, checkpoints=(3,)), backbone, tmp_path / "alone" / "atomic.json", progress=False)
    path = tmp_path / "resumed" / "atomic.json"
    learn = TokMem.learn

    def crash_on_three_tasks(self, examples):
        if len({e.procedures[0] for e in examples}) == 3:
            raise RuntimeError("simulated crash")
        learn(self, examples)

    monkeypatch.setattr(TokMem, "learn", crash_on_three_tasks)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_atomic(joint, backbone, path, progress=False)
    assert [p["num_tasks"] for p in read_json(path)["checkpoints"]] == [2]
    monkeypatch.undo()

    resumed = run_atomic(joint, backbone, path, resume=True, progress=False)
    assert [p["num_tasks"] for p in resumed["checkpoints"]] == [2, 3]
    assert (
        resumed["checkpoints"][1]["methods"]["tokmem"]["per_task"]
        == alone["checkpoints"][0]["methods"]["tokmem"]["per_task"]
    )
    mine, theirs = (
        load_file(p.parent / "atomic-state" / "3" / "tokmem" / "bank.safetensors")
        for p in (path, tmp_path / "alone" / "atomic.json")
    )
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
