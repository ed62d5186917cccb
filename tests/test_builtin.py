"""The built-in demo procedures: exact answers, held-out test queries, chains and subsets."""

import datetime
import random
import re

import pytest

from tokmem.data.builtin import PROCEDURES, catalog, demo_dataset, instructed_prompt, make_example
from tokmem.errors import DataError

SUBSET = ["first_word", "kebab_case", "quote_word"]


def parse(text, value_type):
    """The value a rendered input or response stands for, by its type."""
    if value_type == "number":
        return int(text)
    if value_type == "numbers":
        return [int(x) for x in text.split(", ")]
    if value_type == "date":
        return datetime.date.fromisoformat(text)
    return text


def template_pattern(template, follow_ups=()):
    """A regex matching the template filled in, with any follow-ups before its final punctuation."""
    body = re.escape(template[:-1] + "".join(f", {f}" for f in follow_ups) + template[-1])
    return re.compile(body.replace(r"\{x\}", "(?P<x>.+)"))


def query_input(example):
    """The first procedure's input, read back out of the query."""
    procs = [PROCEDURES[name] for name in example.procedures]
    follow_ups = [p.follow_up for p in procs[1:]]
    for template in procs[0].templates:
        match = template_pattern(template, follow_ups).fullmatch(example.query)
        if match:
            return parse(match["x"], procs[0].input_type)
    raise AssertionError(f"no template of {procs[0].name} matches {example.query!r}")


HAND_COMPUTED = [
    ("quote_word", "apple", '"apple"'),
    ("bracket_word", "apple", "[apple]"),
    ("parenthesize_word", "apple", "(apple)"),
    ("file_name", "apple", "apple.txt"),
    ("first_word", "red fox runs", "red"),
    ("snake_case", "red fox runs", "red_fox_runs"),
    ("kebab_case", "red fox runs", "red-fox-runs"),
    ("comma_list", "red fox runs", "red, fox, runs"),
    ("exclaim", "red fox runs", "red fox runs!"),
    ("question", "red fox runs", "red fox runs?"),
    ("first_number", [5, 2, 9], "5"),
    ("json_list", [5, 2, 9], "[5, 2, 9]"),
    ("semicolon_list", [5, 2, 9], "5; 2; 9"),
    ("wrap_json", 7, '{"value": 7}'),
    ("dollars", 42, "$42"),
    ("percent", 42, "42%"),
    ("kilograms", 42, "42 kg"),
    ("negate", 42, "-42"),
    ("year_of_date", datetime.date(2024, 3, 5), "2024"),
    ("date_slashes", datetime.date(2024, 3, 5), "2024/03/05"),
]


def all_examples(seed=0):
    train, test = demo_dataset(seed=seed)
    return train + test


def test_there_are_at_least_16_procedures_with_unique_snake_case_names():
    assert len(PROCEDURES) >= 16
    for name, proc in PROCEDURES.items():
        assert proc.name == name
        assert re.fullmatch(r"[a-z]+(_[a-z]+)*", name)


def test_no_two_procedures_share_a_template_or_follow_up():
    templates = [t for p in PROCEDURES.values() for t in p.templates]
    follow_ups = [p.follow_up for p in PROCEDURES.values()]
    assert len(set(templates)) == len(templates)
    assert len(set(follow_ups)) == len(follow_ups)


def test_every_procedure_has_three_templates_with_a_slot_and_final_punctuation():
    for proc in PROCEDURES.values():
        assert len(proc.templates) >= 3
        for template in proc.templates:
            assert "{x}" in template, template
            assert template[-1] in ".?", template
        assert proc.follow_up.startswith("then ")


def test_catalog_gives_every_procedure_a_one_sentence_description_in_order():
    descriptions = catalog()
    assert list(descriptions) == list(PROCEDURES)
    assert all(d.endswith(".") and d[0].isupper() for d in descriptions.values())


@pytest.mark.parametrize("name, value, expected", HAND_COMPUTED)
def test_each_procedure_gives_the_hand_computed_answer(name, value, expected):
    proc = PROCEDURES[name]
    assert proc.format(proc.apply(value)) == expected


def test_every_procedure_has_a_hand_computed_case():
    assert {name for name, _, _ in HAND_COMPUTED} == set(PROCEDURES)


def test_inputs_render_the_same_way_in_queries_as_in_responses():
    proc = PROCEDURES["first_number"]
    assert proc.query([3, 1, 2], random.Random(0)) in {t.format(x="3, 1, 2") for t in proc.templates}
    assert PROCEDURES["date_slashes"].format(datetime.date(2024, 3, 5)) == "2024-03-05"


def test_every_step_answers_the_input_read_back_from_the_query_or_the_previous_step():
    for example in all_examples():
        value = query_input(example)
        for step in example.steps:
            proc = PROCEDURES[step.procedure]
            assert step.response == proc.format(proc.apply(value)), example
            value = parse(step.response, proc.output_type)


def test_no_step_returns_its_input_unchanged_or_empty():
    for example in all_examples():
        value = PROCEDURES[example.procedures[0]].format(query_input(example))
        for step in example.steps:
            assert step.response and step.response != value, example
            value = step.response


def test_the_instructed_prompt_gives_each_instruction_with_its_answered_example_then_the_query():
    query = 'What is the first word of "apple river", then put it in quotes?'
    turns = instructed_prompt(["first_word", "quote_word"], query)
    assert [t["role"] for t in turns] == ["user", "assistant", "user", "assistant", "user"]
    assert turns[0]["content"].startswith("Give the first word of the phrase.")
    assert turns[0]["content"].endswith('What is the first word of "red fox"?') and turns[1]["content"] == "red"
    assert turns[2]["content"].startswith("Put the word in double quotes.")
    assert turns[2]["content"].endswith("Put sun in quotes.") and turns[3]["content"] == '"sun"'
    assert turns[-1] == {"role": "user", "content": query}


def test_instructed_prompt_rejects_unknown_procedures():
    with pytest.raises(DataError, match="no_such_procedure"):
        instructed_prompt(["no_such_procedure"], "Hi.")


@pytest.mark.parametrize("name", list(PROCEDURES))
def test_no_sampled_input_is_the_worked_example_of_the_instruction(name):
    proc = PROCEDURES[name]
    rng = random.Random(0)
    assert proc.format(proc.example) not in {proc.format(proc.sample(rng)) for _ in range(500)}


def test_the_same_seed_gives_the_same_dataset():
    assert demo_dataset(seed=7) == demo_dataset(seed=7)


def test_different_seeds_give_different_datasets():
    train_a, test_a = demo_dataset(seed=0)
    train_b, test_b = demo_dataset(seed=1)
    assert [e.query for e in train_a] != [e.query for e in train_b]
    assert [e.query for e in test_a] != [e.query for e in test_b]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_test_queries_never_appear_in_training(seed):
    train, test = demo_dataset(seed=seed)
    assert not {e.query for e in train} & {e.query for e in test}


def test_queries_are_distinct_within_each_split():
    for split in demo_dataset():
        assert len({e.query for e in split}) == len(split)


def test_each_split_has_the_requested_counts_per_procedure_and_of_chains():
    train, test = demo_dataset(train_per_procedure=5, test_per_procedure=2, train_chains=9, test_chains=3)
    for split, per_procedure, chains in ((train, 5, 9), (test, 2, 3)):
        atomic = [e.procedures[0] for e in split if len(e.steps) == 1]
        assert atomic == [name for name in PROCEDURES for _ in range(per_procedure)]
        assert sum(len(e.steps) > 1 for e in split) == chains


def test_ids_name_the_procedure_or_chain_the_split_and_an_index():
    train, test = demo_dataset(train_per_procedure=2, test_per_procedure=1, train_chains=2, test_chains=1)
    assert [e.id for e in train[:2]] == ["quote_word-train-0", "quote_word-train-1"]
    assert [e.id for e in train[-2:]] == ["chain-train-0", "chain-train-1"]
    assert test[0].id == "quote_word-test-0"
    assert test[-1].id == "chain-test-0"
    assert len({e.id for e in train + test}) == len(train + test)


def test_chains_have_two_or_three_type_compatible_steps():
    chains = [e for e in all_examples() if len(e.steps) > 1]
    assert chains
    for example in chains:
        procs = [PROCEDURES[name] for name in example.procedures]
        assert 2 <= len(procs) <= 3
        assert len(set(example.procedures)) == len(procs)
        for before, after in zip(procs, procs[1:]):
            assert before.output_type == after.input_type, example


def test_chain_queries_end_with_the_later_procedures_follow_ups():
    example = make_example(["year_of_date", "negate"], random.Random(0))
    assert example.procedures == ["year_of_date", "negate"]
    assert example.query[:-1].endswith(", then make it negative")
    follow_ups = ["then make it negative"]
    assert any(template_pattern(t, follow_ups).fullmatch(example.query) for t in PROCEDURES["year_of_date"].templates)


def test_one_procedure_makes_an_atomic_example():
    example = make_example(["kebab_case"], random.Random(0))
    assert example.procedures == ["kebab_case"]
    assert example.response == query_input(example).replace(" ", "-")


def test_a_procedures_subset_restricts_atomic_and_chain_examples():
    train, test = demo_dataset(procedures=SUBSET)
    assert {name for e in train + test for name in e.procedures} == set(SUBSET)
    assert any(len(e.steps) > 1 for e in train)
    assert any(len(e.steps) > 1 for e in test)


def test_a_subset_that_does_not_compose_has_no_chains():
    train, test = demo_dataset(procedures=["quote_word", "exclaim", "date_slashes"])
    assert all(len(e.steps) == 1 for e in train + test)
    assert len(train) == 3 * 12 and len(test) == 3 * 4


def test_unknown_procedure_names_are_rejected():
    with pytest.raises(DataError, match="no_such_procedure"):
        demo_dataset(procedures=["quote_word", "no_such_procedure"])
    with pytest.raises(DataError, match="no_such_procedure"):
        make_example(["no_such_procedure"], random.Random(0))


def test_make_example_rejects_a_chain_whose_types_do_not_match():
    with pytest.raises(DataError, match="type mismatch"):
        make_example(["first_word", "json_list"], random.Random(0))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_queries_and_responses_stay_short(seed):
    for example in all_examples(seed):
        assert len(example.query) <= 120, example.query
        assert all(len(step.response) <= 60 for step in example.steps), example
