"""Tool-calling data: the built-in catalog, its calls and composed queries, and the xLAM loader."""

import dataclasses
import json
import random
from collections import Counter

import pytest

from tokmem.data.phrasing import join_queries, join_repeats
from tokmem.data.procedures import call_json
from tokmem.data.tool_catalog import TOOLS, Param, Tool, array_of, catalog, split_tools
from tokmem.data.xlam import load_xlam, rank_tools
from tokmem.errors import DataError
from tokmem.eval.metrics import parse_call
from tokmem.data.tool_datasets import tool_dataset, tool_examples, xlam_dataset

JSON_TYPES = {"integer", "number", "string", "boolean", "array"}
PAPER_TOOLS = {
    "calculate_factorial",
    "binary_search",
    "cosine_similarity",
    "format_date",
    "is_valid_ip_address",
    "solve_quadratic",
}


def fits(value, schema) -> bool:
    """Whether a JSON value has the JSON-schema type ``schema`` (booleans are not numbers)."""
    kind = schema["type"]
    if kind == "array":
        return isinstance(value, list) and all(fits(item, schema["items"]) for item in value)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, {"integer": int, "number": (int, float), "string": str}[kind])


def check_call(step, schemas) -> None:
    """The step is one compact JSON call of its own tool, whose arguments fit the tool's schema."""
    assert parse_call(step.response) is not None
    call = json.loads(step.response)
    assert list(call) == ["name", "arguments"] and call["name"] == step.procedure
    assert step.response == json.dumps(call, ensure_ascii=False, separators=(",", ":"))
    parameters = schemas[step.procedure]["parameters"]
    properties, arguments = parameters["properties"], call["arguments"]
    assert set(parameters["required"]) <= set(arguments) <= set(properties)
    assert list(arguments) == [name for name in properties if name in arguments]  # the signature's order
    for name, value in arguments.items():
        assert fits(value, properties[name]), (step.procedure, name, value)


def queries(examples) -> set[str]:
    return {e.query for e in examples}


# ---- the built-in catalog ---------------------------------------------------------------------------------


def test_the_catalog_has_at_least_40_tools_in_disjoint_adaptation_and_evaluation_halves():
    adaptation, evaluation = split_tools()
    assert len(TOOLS) >= 40
    assert len(adaptation) == len(evaluation) == len(TOOLS) // 2
    assert not set(adaptation) & set(evaluation)
    assert set(adaptation) | set(evaluation) == set(TOOLS)
    assert PAPER_TOOLS <= set(evaluation)


def test_every_tool_has_a_json_schema_signature_with_typed_parameters():
    for name, schema in catalog().items():
        assert schema["name"] == name and schema["description"].strip()
        parameters = schema["parameters"]
        assert parameters["type"] == "object" and parameters["properties"]
        assert set(parameters["required"]) <= set(parameters["properties"])
        for prop in parameters["properties"].values():
            assert prop["type"] in JSON_TYPES and prop["description"].strip()
            assert prop["type"] != "array" or prop["items"]["type"] in JSON_TYPES


def test_every_template_of_every_tool_gives_a_valid_call_whose_arguments_are_in_the_query():

    schemas = catalog()
    rng = random.Random(0)
    for tool in TOOLS.values():
        for template in tool.templates:
            for _ in range(5):
                query, step = dataclasses.replace(tool, templates=(template,)).draw(rng)
                check_call(step, schemas)
                for value in json.loads(step.response)["arguments"].values():
                    if not isinstance(value, bool):  # booleans come from the wording, not a placeholder
                        assert (value if isinstance(value, str) else json.dumps(value)) in query


def test_every_generated_sample_is_a_sequence_of_valid_calls():
    examples = tool_examples(list(TOOLS), n_single=20, n_multi=300, seed=3)
    schemas = catalog()
    assert len(examples) == 20 * len(TOOLS) + 300
    for example in examples:
        assert example.query.strip() and example.id
        for step in example.steps:
            check_call(step, schemas)


def test_some_single_tool_samples_call_their_tool_several_times_with_different_arguments():
    data = tool_dataset()
    repeats = [e for e in data.train if len(set(e.procedures)) == 1 and len(e.steps) > 1]
    assert repeats
    assert all(len(set(e.steps)) == len(e.steps) for e in repeats)
    assert " and " in repeats[0].query


def test_composed_queries_join_their_parts_with_natural_connectors():
    assert join_queries(["Compute a.", "Check b?"]) == "Compute a, then check b?"
    assert join_queries(["Compute a.", "Find b.", "Tell me c."]) == "Compute a, then find b, and also tell me c."
    assert join_queries(["Add x.", "Sort y.", "Count z.", "Validate the IP d."]) == (
        "Add x, then sort y, after that count z, and also validate the IP d."
    )
    assert join_queries(["Do a.", "IP b.", "I want c."]) == "Do a, then IP b, and also I want c."
    assert join_repeats(["Check a."]) == "Check a."
    assert join_repeats(["Check a.", "Check b.", "Check c."]) == "Check a, check b and check c."


# ---- datasets ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def data():
    return tool_dataset(per_tool=20, train_multi=400, test_multi=120, seed=5)


def test_a_dataset_is_deterministic_per_seed(data):
    again = tool_dataset(per_tool=20, train_multi=400, test_multi=120, seed=5)
    other = tool_dataset(per_tool=20, train_multi=400, test_multi=120, seed=6)
    assert (again.train, again.test) == (data.train, data.test)
    assert queries(other.test) != queries(data.test)


def test_a_dataset_uses_the_evaluation_tools_and_offers_their_schemas(data):
    evaluation = set(split_tools()[1])
    assert set(data.tools) == evaluation
    assert {p for e in data.train + data.test for p in e.procedures} == evaluation
    assert data.descriptions()["calculate_factorial"] == TOOLS["calculate_factorial"].description


def test_train_and_test_share_no_query(data):
    assert len(data.test) == 120 and len(data.train) == 25 * 16 + 400
    assert not queries(data.train) & queries(data.test)
    assert len(queries(data.train)) == len(data.train) and len(queries(data.test)) == len(data.test)


def test_test_queries_compose_2_to_4_calls_over_several_tools(data):
    counts = Counter(len(e.steps) for e in data.test)
    assert set(counts) == {2, 3, 4}
    assert all(len(set(e.procedures)) >= 2 for e in data.test)
    assert all(e.id.startswith("multi-test-") for e in data.test)


@pytest.mark.parametrize("cap", [1, 2, 3, 4])
def test_the_training_call_cap_limits_training_and_leaves_the_test_set_unchanged(data, cap):
    capped = tool_dataset(per_tool=20, train_multi=400, test_multi=120, seed=5, train_max_calls=cap)
    assert max(len(e.steps) for e in capped.train) == cap
    assert capped.test == data.test
    composed = [e for e in capped.train if len(set(e.procedures)) > 1]
    assert len(composed) == (0 if cap == 1 else 400)


def test_max_calls_bounds_composed_queries():
    examples = tool_examples(split_tools()[0], n_single=6, n_multi=100, max_calls=2, seed=1)
    composed = [e for e in examples if len(set(e.procedures)) > 1]
    assert len(composed) == 100 and all(len(e.steps) == 2 for e in composed)
    assert max(len(e.steps) for e in examples) == 2


def test_user_tools_extend_the_catalog():
    echo = Tool(
        "echo_words",
        "Repeats words.",
        (Param("words", array_of({"type": "string"}), "The words."),),
        lambda r: {"words": r.sample(["a", "b", "c", "d"], 2)},
        ("Echo {words}.", "Repeat {words}."),
        "evaluation",
    )
    data = tool_dataset(["calculate_factorial", echo], per_tool=10, train_multi=20, test_multi=5)
    assert set(data.tools) == {"calculate_factorial", "echo_words"}
    assert all(len(set(e.procedures)) == 2 for e in data.test)
    for example in data.train + data.test:
        for step in example.steps:
            check_call(step, data.tools)


def test_unknown_tool_names_are_a_data_error():
    with pytest.raises(DataError, match="no_such_tool"):
        tool_dataset(["calculate_factorial", "no_such_tool"])


# ---- xLAM ----------------------------------------------------------------------------------------------------


def xlam_tool(name):
    return {"name": name, "description": f"The {name} tool.", "parameters": {"x": {"type": "int", "description": "x"}}}


def xlam_record(index, *calls, as_strings=True):
    """A record calling the named tools (one call each, argument x = index), with every tool it calls offered."""
    answers = [{"name": name, "arguments": {"x": index}} for name in calls]
    tools = [xlam_tool(name) for name in dict.fromkeys(calls)] + [xlam_tool("unused")]
    wrap = json.dumps if as_strings else (lambda value: value)
    return {
        "id": index,
        "query": f"Use {' and '.join(calls)} on {index}.",
        "answers": wrap(answers),
        "tools": wrap(tools),
    }


FREQUENCIES = {"alpha": 8, "beta": 6, "gamma": 5, "delta": 2}


@pytest.fixture
def xlam_file(tmp_path):
    """alpha..delta called alone 8/6/5/2 times (one alpha sample calls it twice), plus multi-tool records."""
    records, index = [], 0
    for name, count in FREQUENCIES.items():
        for _ in range(count):
            records.append(xlam_record(index, name, as_strings=index % 2 == 0))
            index += 1
    records.append(xlam_record(index, "alpha", "alpha"))
    records += [xlam_record(index + k, "delta", "beta") for k in range(1, 5)]
    path = tmp_path / "xlam.json"
    path.write_text(json.dumps(records), encoding="utf-8")
    return path


def test_xlam_tools_rank_by_their_single_tool_samples(xlam_file):
    records = load_xlam(xlam_file)
    assert len(records) == sum(FREQUENCIES.values()) + 5
    assert rank_tools(records) == [("alpha", 9), ("beta", 6), ("gamma", 5), ("delta", 2)]
    assert records[0].example().steps[0].response == call_json("alpha", {"x": 0})


def test_xlam_ranking_leaves_out_search_and_samples_with_empty_arguments(xlam_file, tmp_path):
    records = json.loads(xlam_file.read_text())
    searches = [xlam_record(100 + k, "search") for k in range(12)]
    empty = [
        {**xlam_record(200 + k, "gamma"), "answers": json.dumps([{"name": "gamma", "arguments": {}}])} for k in range(9)
    ]
    path = tmp_path / "more.json"
    path.write_text(json.dumps(records + searches + empty), encoding="utf-8")
    assert rank_tools(load_xlam(path)) == [("alpha", 9), ("beta", 6), ("gamma", 5), ("delta", 2)]


def test_xlam_dataset_takes_the_ranked_tools_and_caps_the_composed_sets(xlam_file):
    data = xlam_dataset(
        xlam_file, ranks=(1, 3), per_tool=5, train_multi=7, test_multi=3, max_calls=3, test_fraction=0.4
    )
    assert set(data.tools) == {"alpha", "beta", "gamma"} and data.tools["beta"] == xlam_tool("beta")
    singles = [e for e in data.train if len(set(e.procedures)) == 1]
    assert Counter(e.procedures[0] for e in singles) == {"alpha": 3, "beta": 3, "gamma": 3}
    composed = [e for e in data.train if len(set(e.procedures)) > 1]
    assert len(composed) == 7 and len(data.test) == 3
    assert all(2 <= len(e.steps) <= 3 and len(set(e.procedures)) >= 2 for e in composed + data.test)
    assert not queries(data.train) & queries(data.test)
    assert (
        xlam_dataset(
            xlam_file, ranks=(1, 3), per_tool=5, train_multi=7, test_multi=3, max_calls=3, test_fraction=0.4
        ).test
        == data.test
    )


def test_xlam_ranks_select_a_later_band_of_tools(xlam_file):
    data = xlam_dataset(xlam_file, ranks=(2, 3), per_tool=4, train_multi=3, test_multi=2, train_max_calls=1)
    assert set(data.tools) == {"beta", "gamma"}
    assert all(len(e.steps) == 1 for e in data.train)
    assert {p for e in data.train + data.test for p in e.procedures} == {"beta", "gamma"}


def test_xlam_accepts_json_lines(xlam_file, tmp_path):
    lines = tmp_path / "xlam.jsonl"
    lines.write_text("\n".join(json.dumps(r) for r in json.loads(xlam_file.read_text())) + "\n", encoding="utf-8")
    assert load_xlam(lines) == load_xlam(xlam_file)


def test_xlam_ranks_beyond_the_tools_are_a_data_error(xlam_file):
    with pytest.raises(DataError, match="4 single-tool tools"):
        xlam_dataset(xlam_file, ranks=(3, 5))


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"query": "  "}, "query"),
        ({"answers": "[{"}, "answers"),
        ({"answers": {"name": "alpha"}}, "answers"),
        ({"answers": [{"name": "alpha", "arguments": "x=1"}]}, "answers[0].arguments"),
        ({"answers": [{"arguments": {}}]}, "answers[0]"),
        ({"answers": [{"name": "omega", "arguments": {}}]}, "answers[0].name"),
        ({"tools": [{"description": "nameless"}]}, "tools[0]"),
    ],
)
def test_a_bad_xlam_record_is_a_data_error_naming_file_record_and_field(tmp_path, change, field):
    records = [xlam_record(0, "alpha"), {**xlam_record(1, "alpha"), **change}]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(records), encoding="utf-8")
    with pytest.raises(DataError) as caught:
        load_xlam(path)
    assert str(caught.value).startswith(f"{path}: record 1, field '{field}'")


def test_an_xlam_file_that_is_not_records_is_a_data_error(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([xlam_record(0, "alpha"), ["not", "a", "record"]]), encoding="utf-8")
    with pytest.raises(DataError, match="record 1: expected a JSON object"):
        load_xlam(path)
    path.write_text("[{", encoding="utf-8")
    with pytest.raises(DataError, match="invalid JSON"):
        load_xlam(path)


def test_an_xlam_study_adapts_on_the_first_ranks_and_evaluates_on_the_next(xlam_file):
    from research.studies.compositional_config import make_config
    from research.studies.tool_setup import adaptation_examples, tool_data

    config = make_config(
        None,
        "main",
        xlam=str(xlam_file),
        tools=2,
        adapt_tools=2,
        per_tool=4,
        train_multi=2,
        test_multi=2,
        adapt_per_tool=2,
        adapt_multi=0,
    ).resolved()
    assert set(tool_data(config, (1, config.tools)).tools) == {"gamma", "delta"}
    assert {p for e in adaptation_examples(config) for p in e.procedures} == {"alpha", "beta"}
