"""The built-in demo procedures: exact answers, held-out test queries, chains and subsets."""

import datetime
import random
import re

import pytest

from tokmem.data.builtin import PROCEDURES, catalog, demo_dataset, make_example
from tokmem.errors import DataError

SUBSET = ["reverse_word", "uppercase_word", "count_vowels"]


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
    body = body.replace(r"\{x\}", "(?P<x>.+)").replace(r"\{a\}", r"(?P<a>\d+)").replace(r"\{b\}", r"(?P<b>\d+)")
    return re.compile(body)


def query_input(example):
    """The first procedure's input, read back out of the query."""
    procs = [PROCEDURES[name] for name in example.procedures]
    follow_ups = [p.follow_up for p in procs[1:]]
    for template in procs[0].templates:
        match = template_pattern(template, follow_ups).fullmatch(example.query)
        if match and procs[0].input_type == "pair":
            return int(match["a"]), int(match["b"])
        if match:
            return parse(match["x"], procs[0].input_type)
    raise AssertionError(f"no template of {procs[0].name} matches {example.query!r}")


HAND_COMPUTED = [
    ("reverse_word", "apple", "elppa"),
    ("uppercase_word", "river", "RIVER"),
    ("lowercase_word", "ApPlE", "apple"),
    ("count_vowels", "umbrella", "3"),
    ("count_letters", "garden", "6"),
    ("sort_letters", "zebra", "aberz"),
    ("remove_vowels", "banana", "bnn"),
    ("acronym", "portable network graphics", "PNG"),
    ("capitalize_words", "red fox runs", "Red Fox Runs"),
    ("count_words", "one two three", "3"),
    ("reverse_words", "red fox runs", "runs fox red"),
    ("longest_word", "sun apple window tiger", "window"),
    ("sort_numbers", [5, 2, 9], "2, 5, 9"),
    ("max_number", [5, 2, 9], "9"),
    ("min_number", [5, 2, 9], "2"),
    ("sum_numbers", [5, 2, 9], "16"),
    ("reverse_list", [5, 2, 9], "9, 2, 5"),
    ("remove_duplicates", [3, 1, 3, 2, 1], "3, 1, 2"),
    ("count_items", [5, 2, 9, 4], "4"),
    ("filter_evens", [5, 2, 9, 4], "2, 4"),
    ("add_numbers", (12, 30), "42"),
    ("multiply_numbers", (6, 7), "42"),
    ("subtract_numbers", (50, 8), "42"),
    ("modulo", (47, 5), "2"),
    ("square_number", 12, "144"),
    ("double_number", 21, "42"),
    ("sum_digits", 4096, "19"),
    ("format_date", datetime.date(2024, 3, 5), "March 5, 2024"),
    ("day_of_week", datetime.date(2024, 3, 5), "Tuesday"),
    ("to_binary", 10, "1010"),
    ("number_to_words", 42, "forty-two"),
    ("number_to_words", 13, "thirteen"),
    ("number_to_words", 70, "seventy"),
    ("wrap_json", 7, '{"value": 7}'),
]


def all_examples(seed=0):
    train, test = demo_dataset(seed=seed)
    return train + test


def test_there_are_at_least_24_procedures_with_unique_snake_case_names():
    assert len(PROCEDURES) >= 24
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
        slots = ("{a}", "{b}") if proc.input_type == "pair" else ("{x}",)
        for template in proc.templates:
            assert all(slot in template for slot in slots), template
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
    proc = PROCEDURES["sort_numbers"]
    assert proc.query([3, 1, 2], random.Random(0)) in {t.format(x="3, 1, 2") for t in proc.templates}
    assert PROCEDURES["format_date"].format(datetime.date(2024, 3, 5)) == "2024-03-05"


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
    assert [e.id for e in train[:2]] == ["reverse_word-train-0", "reverse_word-train-1"]
    assert [e.id for e in train[-2:]] == ["chain-train-0", "chain-train-1"]
    assert test[0].id == "reverse_word-test-0"
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
    example = make_example(["sort_numbers", "reverse_list", "max_number"], random.Random(0))
    assert example.procedures == ["sort_numbers", "reverse_list", "max_number"]
    assert example.query.endswith(", then reverse the list, then take the maximum.")
    follow_ups = ["then reverse the list", "then take the maximum"]
    assert any(template_pattern(t, follow_ups).fullmatch(example.query) for t in PROCEDURES["sort_numbers"].templates)


def test_chains_skip_inputs_whose_intermediate_result_is_invalid():
    rng = random.Random(0)
    for _ in range(50):
        square, words = make_example(["square_number", "number_to_words"], rng).steps
        assert int(square.response) < 100
        assert words.response.replace("-", "").isalpha()


def test_one_procedure_makes_an_atomic_example():
    example = make_example(["reverse_word"], random.Random(0))
    assert example.procedures == ["reverse_word"]
    assert example.response == query_input(example)[::-1]


def test_a_procedures_subset_restricts_atomic_and_chain_examples():
    train, test = demo_dataset(procedures=SUBSET)
    assert {name for e in train + test for name in e.procedures} == set(SUBSET)
    assert any(len(e.steps) > 1 for e in train)
    assert any(len(e.steps) > 1 for e in test)


def test_a_subset_that_does_not_compose_has_no_chains():
    train, test = demo_dataset(procedures=["acronym", "format_date", "to_binary"])
    assert all(len(e.steps) == 1 for e in train + test)
    assert len(train) == 3 * 12 and len(test) == 3 * 4


def test_unknown_procedure_names_are_rejected():
    with pytest.raises(DataError, match="no_such_procedure"):
        demo_dataset(procedures=["reverse_word", "no_such_procedure"])
    with pytest.raises(DataError, match="no_such_procedure"):
        make_example(["no_such_procedure"], random.Random(0))


def test_make_example_rejects_a_chain_whose_types_do_not_match():
    with pytest.raises(DataError, match="type mismatch"):
        make_example(["reverse_word", "sort_numbers"], random.Random(0))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_queries_and_responses_stay_short(seed):
    for example in all_examples(seed):
        assert len(example.query) <= 120, example.query
        assert all(len(step.response) <= 60 for step in example.steps), example
