"""The open set: off-topic queries as data (`steps: []`), the built-in negatives and evaluation sets kept apart,
negatives trained to leave a query to the backbone, and the share of off-topic queries a bank answers in words."""

import json

import pytest

import tokmem
from tokmem import Example, Step, TrainConfig
from tokmem.data import off_topic
from tokmem.data.procedures import parse_example
from tokmem.decoding.decode import route
from tokmem.errors import DataError, TokMemError
from tokmem.eval.open_set import off_topic_queries, restraint
from tokmem.training.sequences import ANSWER, IGNORE, encode
from tokmem.training.train import picked_config

NAMES = ["get_weather", "convert_currency", "search_flights"]
DESCRIPTIONS = ["Current weather in a city.", "Convert an amount of money from one currency to another."]
TRAVEL = off_topic.bank_words(NAMES, DESCRIPTIONS)


def test_an_example_with_no_steps_is_an_off_topic_query_and_an_answer_needs_a_result():
    example = parse_example({"query": "Tell me a joke.", "steps": []})
    assert example.steps == () and not example.ends_with_result
    with pytest.raises(DataError, match=r"data.jsonl:3: field 'answer'.*there are no steps"):
        parse_example({"query": "Hi.", "steps": [], "answer": "Hello."}, "data.jsonl", 3)
    with pytest.raises(DataError, match=r"data.jsonl:4: field 'steps': missing"):
        parse_example({"query": "Hi."}, "data.jsonl", 4)


def test_an_off_topic_query_is_labelled_once_to_answer_in_words_at_the_routing_position(model):
    model.bank.add(["reverse"], model.backbone.mean_embedding())
    tokenizer = model.backbone.tokenizer
    encoded = encode(Example("Tell me a joke.", ()), tokenizer, model.memory_id, 1024)
    assert [label for label in encoded.labels if label != IGNORE] == [ANSWER]
    assert encoded.labels[-1] == ANSWER and encoded.input_ids[-1] == tokenizer.eos_token_id
    with pytest.raises(DataError, match="no steps"):
        encode(Example("Tell me a joke.", ()), tokenizer, None, 1024)  # a fine-tuning layout has no routing


def test_negatives_never_name_a_word_of_the_banks_procedures_and_differ_from_the_evaluation_prompts():
    negatives = off_topic.negatives(500, 0, NAMES, DESCRIPTIONS)
    queries = [n.query for n in negatives]
    assert len(queries) > 150 and len(set(queries)) == len(queries)
    assert all(n.steps == () for n in negatives)
    assert not any(off_topic.mentions(q, TRAVEL) for q in queries)
    kept = [n.query for n in off_topic.negatives(500, 0, ["write_poem"])]
    assert any("poem" in q for q in queries) and not any("poem" in q or "Write" in q for q in kept)
    assert not set(off_topic.generated(0)) & set(off_topic.chat_prompts())
    assert off_topic.generated(0) == off_topic.generated(0) != off_topic.generated(1)


def test_the_bank_words_meet_other_forms_of_a_word_but_not_other_words_or_common_ones():
    assert off_topic.mentions("Book me two flights to Rome", TRAVEL)
    assert off_topic.mentions("Which cities are converted to a currency union?", TRAVEL)
    assert not off_topic.mentions("Tell me a joke about cats.", TRAVEL)
    assert not off_topic.mentions("What is the current time in Tokyo?", TRAVEL)  # "current" is not "currency"
    assert "currency" in TRAVEL and "another" not in TRAVEL  # "another" is a common word


def test_near_misses_name_the_banks_words_and_make_up_to_half_the_negatives_when_asked():
    near = off_topic.near_misses(NAMES, DESCRIPTIONS, seed=0)
    assert "Tell me a joke about the word 'currency'." in near and len(set(near)) == len(near)
    assert all(off_topic.mentions(q, TRAVEL) for q in near)
    assert near == off_topic.near_misses(NAMES, DESCRIPTIONS, seed=0) != off_topic.near_misses(NAMES, DESCRIPTIONS, 1)
    jokes = off_topic.near_misses(["tell_joke"], ["Tell a joke about a topic."])
    assert jokes and not any("joke" in q.lower().split("'")[0] for q in jokes)  # a frame naming the bank is skipped
    mixed = [n.query for n in off_topic.negatives(40, 0, NAMES, DESCRIPTIONS, near=True)]
    assert len(mixed) == 40 and sum(q in near for q in mixed) == 20
    assert not set(mixed) & set(near[20:]) and not any(q in near for q in off_topic.negatives(40, 0, NAMES))


def test_a_users_off_topic_file_is_text_lines_or_jsonl_queries_and_bad_lines_are_named(tmp_path):
    (tmp_path / "chat.txt").write_text("Tell me a joke.\n\nWrite a poem.\n")
    (tmp_path / "chat.jsonl").write_text('{"query": "Hi.", "steps": []}\n{"text": "no query"}\n')
    assert off_topic_queries(str(tmp_path / "chat.txt")) == ["Tell me a joke.", "Write a poem."]
    with pytest.raises(DataError, match=r"chat.jsonl:2: field 'query'"):
        off_topic_queries(str(tmp_path / "chat.jsonl"))
    with pytest.raises(TokMemError, match="no such file, nor a built-in set"):
        off_topic_queries("chatter")


def test_bfcl_irrelevance_questions_are_read_from_the_installed_wheel():
    pytest.importorskip("bfcl_eval")
    questions = off_topic.off_topic_set("bfcl-irrelevance")
    assert len(questions) == 240 and all(isinstance(q, str) and q for q in questions)
    assert len(off_topic.off_topic_set("bfcl-live-irrelevance")) == 884


def test_the_picked_budget_counts_the_negatives_among_the_examples():
    examples = [Example(f"q{k}", (Step("p", "r"),)) for k in range(40)]
    with_negatives = picked_config(examples, new_rows=2, negatives=0.5)
    without = picked_config(examples, new_rows=2, negatives=0.0)
    steps = lambda c, n: c.epochs * -(-n // c.batch_size)  # noqa: E731
    assert steps(with_negatives, 60) >= 100 and steps(without, 40) >= 100
    assert with_negatives.epochs < without.epochs


def test_training_beside_negatives_lowers_the_memory_mass_of_off_topic_queries(backbone, examples):
    queries = [n.query for n in off_topic.negatives(40, 7)]  # another seed: not the queries trained on
    masses = {}
    for negatives in (0.0, 2.0):
        model = tokmem.create(backbone)
        report = tokmem.learn(model, examples, TrainConfig(epochs=4, lr=0.05, negatives=negatives, progress=False))
        assert report.negatives == round(negatives * len(examples))
        masses[negatives] = sum(r.memory_mass for r in route(model, queries)) / len(queries)
    assert masses[2.0] < masses[0.0]


def test_restraint_counts_the_queries_answered_in_words_and_sets_apart_those_naming_the_bank(model):
    model.bank.add(["get_weather"], model.backbone.mean_embedding(), descriptions=["Current weather in a city."])
    queries = ["Tell me a joke.", "Write a poem.", "Is it raining? Check the weather."]
    found = restraint(model, queries, threshold=0.0)  # every query routes
    assert (found["queries"], found["about_the_bank"], found["scored"], found["answered_in_words"]) == (3, 1, 2, 0)
    assert found["restraint"] == 0.0 and [r["procedure"] for r in found["routed"]] == ["get_weather"] * 2
    assert restraint(model, queries, threshold=1.01)["restraint"] == 1.0


def test_tokmem_eval_reports_the_data_files_off_topic_queries_apart_from_the_in_domain_scores(tmp_path, model):
    from tokmem.cli import main

    model.bank.add(["reverse"], model.backbone.mean_embedding())
    model.bank.save(tmp_path / "bank.safetensors")
    data = tmp_path / "held.jsonl"
    lines = [
        {"query": "Reverse the word apple.", "steps": [{"procedure": "reverse", "response": "elppa"}]},
        {"query": "Tell me a joke.", "steps": []},
    ]
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "scores.json"
    main(["eval", "--bank", str(tmp_path / "bank.safetensors"), "--data", str(data), "--json", str(out), "--quiet"])
    result = json.loads(out.read_text())
    assert len(result["predictions"]) == 1
    assert result["off_topic"][str(data)]["scored"] == 1
    assert result["off_topic"]["chat"]["scored"] == len(off_topic.chat_prompts())


def test_a_banks_threshold_is_kept_in_its_file_and_decodes_unless_a_caller_gives_one(tmp_path, backbone, examples):
    from tokmem.bank import MemoryBank
    from tokmem.decoding.decode import OPEN_SET_THRESHOLD, DecodeConfig, generate, open_set_threshold

    model = tokmem.create(backbone)
    tokmem.learn(model, examples, TrainConfig(epochs=1, threshold=1.0, progress=False))
    assert open_set_threshold(model.bank) == 1.0 and open_set_threshold(model.bank, 0.0) == 0.0
    model.bank.save(tmp_path / "b.safetensors")
    assert MemoryBank.load(tmp_path / "b.safetensors").threshold == 1.0
    queries = [e.query for e in examples]
    assert not any(g.routed for g in generate(model, queries, DecodeConfig(max_new_tokens=2)))  # no mass reaches 1
    assert all(g.routed for g in generate(model, queries, DecodeConfig(max_new_tokens=2, threshold=0.0)))
    model.bank.threshold = None
    assert open_set_threshold(model.bank) == OPEN_SET_THRESHOLD


def test_a_bank_file_with_a_threshold_outside_0_to_1_is_refused_naming_the_field(tmp_path, model):
    from tokmem.bank import MemoryBank
    from tokmem.errors import BankError

    model.bank.add(["reverse"], model.backbone.mean_embedding())
    model.bank.threshold = 0.8
    path = model.bank.save(tmp_path / "b.safetensors")
    meta = tmp_path / "b.safetensors.json"
    meta.write_text(meta.read_text().replace('"threshold": 0.8', '"threshold": 2'))
    with pytest.raises(BankError, match="field 'threshold' must be a number from 0 to 1"):
        MemoryBank.load(path)
