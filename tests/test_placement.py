"""The placement study: Steps@90%Best, the two placements, memorisation and GSM8K end to end, the GSM8K loader."""

import argparse
import json
from dataclasses import replace
from pathlib import Path

import pytest

from tokmem.data.gsm8k import load_gsm8k
from tokmem.errors import DataError, TokMemError
from tokmem.experiments import placement
from tokmem.experiments.placement import GSM8KConfig, MemorizationConfig, steps_at_90
from tokmem.layout import IGNORE, chat_prefix
from tokmem.metrics import gsm8k_compliant

GSM8K = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k"
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
    run = placement.memorize(lively_backbone, method, 2, corpus, config)
    assert run["steps"] == [0, 2, 4, 5]
    assert run["ppl"][-1] < 0.9 * run["ppl"][0]


def test_memorization_study_writes_json_markdown_and_png(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    config = MemorizationConfig(
        backbone="tiny-random", text=str(text), text_tokens=(32, 64), memory_tokens=(1, 2), sequence_length=16,
        steps=4, eval_every=2, seeds=2, progress=False,
    )
    placement.run_study("memorization", config, tmp_path / "out" / "memo.json")
    result = json.loads((tmp_path / "out" / "memo.json").read_text())
    assert list(result["memorization"]) == ["32", "64"]
    for methods in result["memorization"].values():
        assert list(methods) == ["prefix-1", "tokmem-1", "prefix-2", "tokmem-2"]
        for entry in methods.values():
            assert entry["ppl"] > 1 and entry["steps_at_90"] in (0, 2, 4)
            assert entry["curve"]["steps"] == [0, 2, 4] and len(entry["runs"]) == 2
            assert entry["ppl"] == pytest.approx(entry["curve"]["ppl"][-1])
    assert result["ppl_before"] > 1
    assert result["config"]["seeds"] == 2 and result["machine"]["tokmem"] == result["tokmem"]
    markdown = (tmp_path / "out" / "memo.md").read_text()
    assert "| TokMem-2 |" in markdown and "32 tokens: Steps@90%Best" in markdown
    assert (tmp_path / "out" / "memo.png").read_bytes()[:4] == b"\x89PNG"


def test_memorization_refuses_text_sizes_that_do_not_fill_whole_sequences(tmp_path):
    with pytest.raises(TokMemError, match="multiples of the sequence length"):
        placement.run_memorization(MemorizationConfig(backbone="tiny-random", text_tokens=(40,), sequence_length=16))


def test_memorization_refuses_a_text_shorter_than_asked(tmp_path):
    text = tmp_path / "short.txt"
    text.write_text("too short", encoding="utf-8")
    config = MemorizationConfig(backbone="tiny-random", text=str(text), text_tokens=(32,), sequence_length=16)
    with pytest.raises(DataError, match="fewer than the 32 text tokens"):
        placement.run_memorization(config)


def _cli(*argv):
    parser = argparse.ArgumentParser()
    placement.add_parser(parser.add_subparsers())
    return parser.parse_args(["placement", *argv])


def test_command_line_options_override_the_preset():
    config = placement.study_config(_cli("--backbone", "tiny-random", "--seeds", "3", "--quiet", "--json", "x.json"))
    assert config == replace(placement.PRESETS["memorization"]["cpu"], backbone="tiny-random", seeds=3, progress=False)
    assert placement.study_config(_cli("--study", "gsm8k", "--preset", "paper", "--json", "x.json")) == GSM8KConfig()


def test_an_option_of_the_other_study_is_an_error():
    with pytest.raises(TokMemError, match="--steps does not apply to --study gsm8k"):
        placement.study_config(_cli("--study", "gsm8k", "--steps", "5", "--json", "x.json"))


@pytest.mark.skipif(not GSM8K.is_dir(), reason="no GSM8K data in ../shared/data/gsm8k")
@pytest.mark.parametrize("split", ["train", "test"])
def test_gsm8k_loader_reads_the_real_files(split):
    problems = load_gsm8k(GSM8K / f"{split}.jsonl")
    assert len(problems) > 100
    assert all(p.question.strip() and gsm8k_compliant(p.answer) for p in problems)


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
        lines = [json.dumps({"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"}) for i in range(count)]
        (folder / f"{name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_gsm8k_study_trains_both_methods_on_each_fraction_and_scores_the_test_answers(tmp_path):
    _write_gsm8k(tmp_path / "gsm8k", train=10, test=3)
    config = GSM8KConfig(backbone="tiny-random", data=str(tmp_path / "gsm8k"), max_new_tokens=4, progress=False)
    result = placement.run_study("gsm8k", config, tmp_path / "gsm8k.json")
    assert json.loads((tmp_path / "gsm8k.json").read_text())["gsm8k"] == result["gsm8k"]
    assert list(result["gsm8k"]) == ["20", "100"]
    assert [result["gsm8k"][f][m]["train_examples"] for f in ("20", "100") for m in ("prefix", "tokmem")] == [2, 2, 10, 10]
    assert [result["gsm8k"][f]["tokmem"]["steps"] for f in ("20", "100")] == [1, 3]  # batches of 4, one epoch
    for methods in result["gsm8k"].values():
        for scores in methods.values():
            assert 0 <= scores["em"] <= scores["compliance"] <= 1
            assert len(scores["samples"]) == 3
    markdown = (tmp_path / "gsm8k.md").read_text()
    assert "| 20% | Prefix tuning |" in markdown and "| 100% | TokMem |" in markdown
