"""The placement study: Steps@90%Best, the two placements, memorisation and GSM8K end to end, the GSM8K loader."""

import argparse
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tokmem.data.gsm8k import Problem, gsm8k_strictly_compliant, load_gsm8k
from tokmem.errors import DataError, TokMemError
from research import cli
from research.studies import gsm8k_placement, gsm8k_placement_config, memorization, memorization_config, placement
from research.studies.gsm8k_placement_config import GSM8KConfig
from research.studies.memorization import steps_at_90
from research.studies.memorization_config import MemorizationConfig
from tokmem.training.sequences import IGNORE, chat_prefix
from tokmem.training.train import TrainConfig, fit

GSM8K = Path(__file__).resolve().parents[3] / "shared" / "data" / "gsm8k"
TEXT = "TokMem compiles each procedure into one trainable embedding used by a frozen language model. " * 12


@pytest.mark.parametrize(
    ("steps", "ppl", "expected"),
    [
        ([0, 10, 20, 30], [100.0, 20.0, 10.5, 10.0], 20),  # 10.5 ≤ 10 / 0.9
        ([0, 10, 20, 30], [100.0, 12.0, 11.2, 10.0], 30),  # 11.2 > 10 / 0.9 = 11.11
        ([0, 100, 200], [50.0, 9.0, 30.0], 100),  # the best need not be the last evaluation
        ([0, 5], [10 / 0.9, 10.0], 0),  # exactly at the threshold counts
        ([0, 100], [5.0, 5.0], 0),  # already there before training
    ],
)
def test_steps_at_90_is_the_first_step_within_90_percent_of_the_best_perplexity(steps, ppl, expected):
    assert steps_at_90(steps, ppl) == expected


def test_steps_at_90_needs_one_perplexity_per_step():
    with pytest.raises(ValueError, match="one perplexity per evaluated step"):
        steps_at_90([0, 10], [5.0])


def test_tokmem_places_its_memory_tokens_after_the_query_and_prefix_before_it(backbone):
    query = chat_prefix(backbone.tokenizer, "abc def")
    tokmem_model, prefix_model = (placement.build(m, 2, backbone) for m in ("tokmem", "prefix"))
    memory = [backbone.vocab_size, backbone.vocab_size + 1]
    infix = placement.lay_out(tokmem_model, "tokmem", "abc def", [7, 8])
    before = placement.lay_out(prefix_model, "prefix", "abc def", [7, 8])
    assert tokmem_model.bank.names == ["text#0", "text#1"]
    assert infix.input_ids == query + memory + [7, 8]
    assert before.input_ids == memory + query + [7, 8]
    assert infix.labels == before.labels == [IGNORE] * (len(query) + 2) + [7, 8]


@pytest.mark.parametrize("method", ["prefix", "tokmem"])
def test_memorising_lowers_the_perplexity_of_the_text(lively_backbone, method):
    text = lively_backbone.tokenizer(TEXT[:64])["input_ids"]
    corpus = [("qwe rty", text[:32]), ("uio pas", text[32:])]
    config = MemorizationConfig(steps=5, eval_every=2, lr=5e-2, progress=False)
    run = memorization.memorize(lively_backbone, method, 2, corpus, config)
    assert run["steps"] == [0, 2, 4, 5]
    assert run["ppl"][-1] < 0.9 * run["ppl"][0]


def test_memorization_study_writes_json_markdown_and_png(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    config = MemorizationConfig(
        backbone="tiny-random",
        text=str(text),
        text_tokens=(32, 64),
        memory_tokens=(1, 2),
        sequence_length=16,
        steps=4,
        eval_every=2,
        seeds=(0, 1),
        progress=False,
    )
    memorization.run_study(config, tmp_path / "out" / "memo.json")
    result = json.loads((tmp_path / "out" / "memo.json").read_text())
    assert list(result["memorization"]) == ["32", "64"]
    for methods in result["memorization"].values():
        assert list(methods) == ["prefix-1", "tokmem-1", "prefix-2", "tokmem-2"]
        for entry in methods.values():
            assert entry["ppl"] > 1 and entry["steps_at_90"] in (0, 2, 4)
            assert entry["curve"]["steps"] == [0, 2, 4] and len(entry["runs"]) == 2
            assert entry["ppl"] == pytest.approx(entry["curve"]["ppl"][-1])
    assert result["ppl_before"] > 1
    assert result["config"]["seeds"] == [0, 1] and result["machine"]["tokmem"] == result["tokmem"]
    markdown = (tmp_path / "out" / "memo.md").read_text()
    assert "| TokMem-2 |" in markdown and "32 tokens: Steps@90%Best" in markdown
    assert (tmp_path / "out" / "memo.png").read_bytes()[:4] == b"\x89PNG"


def test_memorization_refuses_text_sizes_that_do_not_fill_whole_sequences(tmp_path):
    with pytest.raises(TokMemError, match="multiples of the sequence length"):
        memorization.run_memorization(MemorizationConfig(backbone="tiny-random", text_tokens=(40,), sequence_length=16))


def test_memorization_refuses_a_text_shorter_than_asked(tmp_path):
    text = tmp_path / "short.txt"
    text.write_text("too short", encoding="utf-8")
    config = MemorizationConfig(backbone="tiny-random", text=str(text), text_tokens=(32,), sequence_length=16)
    with pytest.raises(DataError, match="fewer than the 32 text tokens"):
        memorization.run_memorization(config)


def _cli(*argv):
    parser = argparse.ArgumentParser()
    cli.add_placement(parser.add_subparsers())
    return parser.parse_args(["placement", *argv])


def test_command_line_options_override_the_preset():
    config = cli.placement_config(_cli("--backbone", "tiny-random", "--seeds", "3,4", "--quiet", "--json", "x.json"))
    assert config == replace(
        memorization_config.make_config("cpu"), backbone="tiny-random", seeds=(3, 4), progress=False
    )
    assert cli.placement_config(_cli("--study", "gsm8k", "--preset", "paper", "--json", "x.json")) == GSM8KConfig()


def test_an_option_of_the_other_study_is_an_error():
    with pytest.raises(TokMemError, match="--steps does not apply to --study gsm8k"):
        cli.placement_config(_cli("--study", "gsm8k", "--steps", "5", "--json", "x.json"))


@pytest.mark.skipif(not GSM8K.is_dir(), reason="no GSM8K data in ../shared/data/gsm8k")
@pytest.mark.parametrize("split", ["train", "test"])
def test_gsm8k_loader_reads_the_real_files(split):
    problems = load_gsm8k(GSM8K / f"{split}.jsonl")
    assert len(problems) > 100
    assert all(p.question.strip() and gsm8k_strictly_compliant(p.answer) for p in problems)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"question": "How many?"}', "line 2: field 'answer' is missing"),
        ('{"question": "", "answer": "#### 3"}', "line 2: field 'question' is missing or empty"),
        ('{"question": "How many?", "answer": "three"}', "does not end with '#### <number>'"),
        ('["How many?", "#### 3"]', "expected a JSON object"),
        ('{"question": "How many?",', "invalid JSON"),
    ],
)
def test_gsm8k_loader_names_the_bad_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "1 + 1?", "answer": "1 + 1 = 2\\n#### 2"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=message.replace("line 2", "bad.jsonl:2")):
        load_gsm8k(path)


def test_gsm8k_loader_refuses_an_empty_file(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n", encoding="utf-8")
    with pytest.raises(DataError, match="no problems"):
        load_gsm8k(tmp_path / "empty.jsonl")


def _write_gsm8k(folder: Path, train: int, test: int) -> None:
    folder.mkdir()
    for name, count in (("train", train), ("test", test)):
        lines = [
            json.dumps({"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"})
            for i in range(count)
        ]
        (folder / f"{name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


PROBLEM = Problem("How many?", "2 + 2 = 4\n#### 4")


def _tokens(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _chat(tokenizer, query: str, header: bool) -> str:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": query}], tokenize=False, add_generation_prompt=header
    )


def test_reference_layout_places_the_memory_token_between_the_user_turn_and_the_assistant_header(backbone):
    tokenizer = backbone.tokenizer
    model = placement.build("tokmem", 1, backbone, name="gsm8k")
    encoded = gsm8k_placement.gsm8k_encode(model, "tokmem", "reference", PROBLEM)
    turn_text = _chat(tokenizer, "question: How many?", header=False)
    turn, header = (
        _tokens(tokenizer, turn_text),
        _tokens(tokenizer, _chat(tokenizer, "question: How many?", header=True)[len(turn_text) :]),
    )
    target = _tokens(tokenizer, "answer: 2 + 2 = 4\n#### 4") + [tokenizer.eos_token_id]
    assert (
        tokenizer.decode(turn).endswith("question: How many?<|im_end|>\n")
        and tokenizer.decode(header) == "<|im_start|>assistant\n"
    )
    assert encoded.input_ids == turn + [backbone.vocab_size] + header + target
    assert encoded.labels == [IGNORE] * (len(turn) + 1 + len(header)) + target  # neither the query nor the memory token
    context = gsm8k_placement.gsm8k_context(model, "tokmem", "reference", PROBLEM.question)
    assert context == encoded.input_ids[: len(context)] and len(context) == len(encoded.input_ids) - len(target)


def test_prefix_tuning_keeps_its_rows_before_the_same_framed_query_in_the_reference_layout(backbone):
    tokenizer = backbone.tokenizer
    model = placement.build("prefix", 1, backbone, name="gsm8k")
    encoded = gsm8k_placement.gsm8k_encode(model, "prefix", "reference", PROBLEM)
    query = chat_prefix(tokenizer, "question: How many?")
    target = _tokens(tokenizer, "answer: 2 + 2 = 4\n#### 4") + [tokenizer.eos_token_id]
    assert encoded.input_ids == [backbone.vocab_size] + query + target
    assert encoded.labels == [IGNORE] * (1 + len(query)) + target


def test_assistant_layout_places_the_memory_token_after_the_assistant_header_with_the_bare_texts(backbone):
    tokenizer = backbone.tokenizer
    model = placement.build("tokmem", 1, backbone, name="gsm8k")
    encoded = gsm8k_placement.gsm8k_encode(model, "tokmem", "assistant", PROBLEM)
    query = chat_prefix(tokenizer, "How many?")
    target = _tokens(tokenizer, PROBLEM.answer) + [tokenizer.eos_token_id]
    assert encoded.input_ids == query + [backbone.vocab_size] + target
    assert encoded.labels == [IGNORE] * (len(query) + 1) + target


def test_gsm8k_scores_report_both_compliance_rules_and_exact_match():
    problems = [Problem("q", "#### 4"), Problem("q", "#### 7"), Problem("q", "#### 1"), Problem("q", "#### 2")]
    answers = ["so 4\n#### 4", "#### 7 apples", "####1", "no marker"]
    scores = gsm8k_placement.gsm8k_scores(answers, problems)
    assert scores == {"compliance": 0.5, "strict_compliance": 0.5, "em": 0.75}


@pytest.mark.parametrize(
    ("examples", "batch_size", "epochs", "ends"),
    [(8, 4, 3, {2: 1, 4: 2, 6: 3}), (10, 4, 2, {3: 1, 5: 2}), (2, 4, 3, {1: 2, 2: 3})],
)
def test_an_epoch_ends_at_the_step_that_holds_its_last_example(examples, batch_size, epochs, ends):
    assert gsm8k_placement.epoch_ends(examples, batch_size, epochs) == ends


@pytest.mark.parametrize(
    ("scores", "kept"),
    [
        ([(0.1, 0.5), (0.3, 0.6), (0.2, 1.0)], 2),  # the best exact match
        ([(0.0, 0.5), (0.0, 0.9), (0.0, 0.9)], 2),  # equal exact match: the higher compliance, then the earlier epoch
        ([(0.0, 0.0), (0.0, 0.0), (0.0, 0.0)], 1),
    ],
)
def test_best_by_validation_keeps_the_rows_of_the_best_epoch(backbone, scores, kept):
    model = placement.build("tokmem", 1, backbone, name="gsm8k")
    encoded = [
        gsm8k_placement.gsm8k_encode(model, "tokmem", "reference", Problem(f"{i}?", f"#### {i}")) for i in range(4)
    ]
    best, rows = gsm8k_placement.BestByValidation(), {}

    def validate(step: int, total: int) -> None:
        rows[step] = model.memory_matrices()[0].detach().clone()
        em, compliance = scores[step - 1]
        best.offer(model, step, {"em": em, "compliance": compliance, "strict_compliance": 0.0})

    fit(model, encoded, TrainConfig(lr=0.1, epochs=3, batch_size=4, progress=False), on_step=validate)
    final = model.bank.index.clone()
    best.restore(model)
    assert best.epoch == kept and [point["epoch"] for point in best.curve] == [1, 2, 3]
    assert torch.equal(model.bank.index, rows[kept])
    assert kept == 3 or not torch.equal(model.bank.index, final)


def test_the_validation_split_is_the_end_of_the_training_file_and_the_subset_comes_before_it():
    problems = [Problem(f"{i}?", f"#### {i}") for i in range(10)]
    train, validation = gsm8k_placement.split_gsm8k(problems, GSM8KConfig(train_examples=4, validation_examples=3))
    assert [p.question for p in train] == ["0?", "1?", "2?", "3?"]
    assert [p.question for p in validation] == ["7?", "8?", "9?"]
    assert len(gsm8k_placement.split_gsm8k(problems, GSM8KConfig(validation_examples=3))[0]) == 7
    with pytest.raises(DataError, match="10 problems, too few to hold out 10 for validation"):
        gsm8k_placement.split_gsm8k(problems, GSM8KConfig(validation_examples=10))


@pytest.mark.parametrize("layout", ["reference", "assistant"])
def test_gsm8k_study_trains_both_methods_per_fraction_keeps_the_best_epoch_and_scores_the_test_answers(
    tmp_path, layout
):
    _write_gsm8k(tmp_path / "gsm8k", train=12, test=3)
    config = GSM8KConfig(
        backbone="tiny-random",
        data=str(tmp_path / "gsm8k"),
        layout=layout,
        validation_examples=2,
        epochs=2,
        batch_size=2,
        max_new_tokens=4,
        progress=False,
    )
    result = gsm8k_placement.run_study(config, tmp_path / "gsm8k.json")
    assert json.loads((tmp_path / "gsm8k.json").read_text())["gsm8k"] == result["gsm8k"]
    assert result["config"]["layout"] == layout and result["config"]["epochs"] == 2
    assert (result["train_examples"], result["validation_examples"], result["test_examples"]) == (10, 2, 3)
    assert list(result["gsm8k"]) == ["20", "100"]
    assert [result["gsm8k"][f][m]["train_examples"] for f in ("20", "100") for m in ("prefix", "tokmem")] == [
        2,
        2,
        10,
        10,
    ]
    assert [result["gsm8k"][f]["tokmem"]["steps"] for f in ("20", "100")] == [2, 10]  # batches of 2, two epochs
    for methods in result["gsm8k"].values():
        for scores in methods.values():
            assert all(0 <= scores[key] <= 1 for key in ("compliance", "strict_compliance", "em"))
            assert [point["epoch"] for point in scores["validation"]] == [1, 2]
            best = max(scores["validation"], key=lambda point: (point["em"], point["compliance"], -point["epoch"]))
            assert scores["best_epoch"] == best["epoch"]
            assert len(scores["samples"]) == 3
    markdown = (tmp_path / "gsm8k.md").read_text()
    assert f"{layout} layout" in markdown and "| Compliance ↑ | Strict compliance ↑ | EM ↑ | Kept epoch |" in markdown
    rows = [line for line in markdown.splitlines() if line.startswith(("| 20% |", "| 100% |"))]
    kept = [f"| {result['gsm8k'][f][m]['best_epoch']} of 2 |" for f in ("20", "100") for m in ("prefix", "tokmem")]
    assert [row.split(" | ")[1] for row in rows] == ["Prefix tuning", "TokMem"] * 2 and all(
        map(str.endswith, rows, kept)
    )


def test_gsm8k_options_reach_the_config_and_the_layout_is_checked():
    args = _cli(
        "--study", "gsm8k", "--layout", "assistant", "--epochs", "2", "--validation-examples", "9", "--json", "x.json"
    )
    config = cli.placement_config(args)
    assert (config.layout, config.epochs, config.validation_examples) == ("assistant", 2, 9)
    assert (
        gsm8k_placement_config.make_config("paper").layout
        == gsm8k_placement_config.make_config("cpu").layout
        == "reference"
    )
    with pytest.raises(TokMemError, match="unknown GSM8K layout 'suffix'"):
        gsm8k_placement.run_gsm8k(GSM8KConfig(layout="suffix"))


def test_a_resumed_gsm8k_study_skips_the_runs_its_json_holds_and_refuses_other_settings(tmp_path):
    _write_gsm8k(tmp_path / "gsm8k", train=8, test=2)
    config = GSM8KConfig(
        backbone="tiny-random",
        data=str(tmp_path / "gsm8k"),
        validation_examples=2,
        epochs=1,
        fractions=(0.5, 1.0),
        max_new_tokens=2,
        progress=False,
    )
    path = tmp_path / "gsm8k.json"
    first = gsm8k_placement.run_study(config, path)
    saved = json.loads(path.read_text())
    saved["gsm8k"]["50"]["tokmem"]["train_seconds"] = -1.0  # a mark: a skipped run keeps it
    del saved["gsm8k"]["100"]["prefix"]  # as if the run had stopped before this one
    path.write_text(json.dumps(saved))
    resumed = gsm8k_placement.run_study(replace(config, device="cpu"), path, resume=True)
    assert resumed["gsm8k"]["50"]["tokmem"]["train_seconds"] == -1.0
    assert resumed["gsm8k"]["100"]["prefix"]["steps"] == first["gsm8k"]["100"]["prefix"]["steps"] == 2
    assert (
        list(resumed["gsm8k"]["100"]) == ["tokmem", "prefix"]
        and json.loads(path.read_text())["gsm8k"] == resumed["gsm8k"]
    )
    with pytest.raises(TokMemError, match="other settings \\(epochs\\)"):
        gsm8k_placement.run_study(replace(config, epochs=2), path, resume=True)


def test_resume_applies_to_the_gsm8k_study_only():
    with pytest.raises(TokMemError, match="--resume does not apply to --study memorization"):
        cli.cmd_placement(_cli("--resume", "--json", "x.json"))
