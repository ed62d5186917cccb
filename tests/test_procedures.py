"""The procedures JSONL contract and its error messages."""

import gzip
import json

import pytest

from tokmem.data import Example, Step, load_catalog, load_examples, save_examples
from tokmem.data.procedures import assemble_call, call_json, load_schemas, schema_order, tool_procedures
from tokmem.errors import DataError


def write_lines(path, *lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_examples_round_trip_through_jsonl(tmp_path):
    examples = [
        Example("Reverse abc.", (Step("reverse", "cba"),), id="a"),
        Example("Reverse abc then upper it.", (Step("reverse", "cba"), Step("upper", "CBA"))),
    ]
    save_examples(examples, tmp_path / "x.jsonl")
    assert load_examples(tmp_path / "x.jsonl") == examples


def test_a_save_that_fails_midway_leaves_the_previous_file_whole(tmp_path):
    path = tmp_path / "x.jsonl"
    kept = [Example("Reverse abc.", (Step("reverse", "cba"),))]
    save_examples(kept, path)
    with pytest.raises(TypeError):
        save_examples(kept + [Example("Bad.", (Step("reverse", {"not", "json"}),))], path)
    assert load_examples(path) == kept
    assert [p.name for p in tmp_path.iterdir()] == ["x.jsonl"]


def test_gzip_files_are_read_and_a_bad_one_is_a_data_error(tmp_path):
    line = '{"query": "q", "steps": [{"procedure": "p", "response": "r"}]}\n'
    (tmp_path / "x.jsonl.gz").write_bytes(gzip.compress(line.encode()))
    assert load_examples(tmp_path / "x.jsonl.gz") == [Example("q", (Step("p", "r"),))]
    (tmp_path / "bad.jsonl.gz").write_text(line)
    with pytest.raises(DataError, match="bad.jsonl.gz: not a gzip file"):
        load_examples(tmp_path / "bad.jsonl.gz")


def test_chain_response_is_one_line_per_segment():
    example = Example("q", (Step("a", "1"), Step("b", "2")))
    assert example.response == "1\n2"
    assert example.procedures == ["a", "b"]


def test_blank_lines_are_skipped(tmp_path):
    path = write_lines(tmp_path / "x.jsonl", '{"query": "q", "steps": [{"procedure": "p", "response": "r"}]}', "", "  ")
    assert len(load_examples(path)) == 1


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"query": "q", "steps": [', "x.jsonl:2: invalid JSON"),
        ('{"steps": [{"procedure": "p", "response": "r"}]}', "x.jsonl:2: field 'query'"),
        ('{"query": "q"}', "x.jsonl:2: field 'steps'"),
        ('{"query": "q", "steps": {}}', "x.jsonl:2: field 'steps'"),  # steps: [] is an off-topic query
        ('{"query": "q", "steps": [{"procedure": "p", "response": ""}]}', "x.jsonl:2: field 'steps[0].response'"),
        ('{"query": "q", "steps": [{"response": "r"}]}', "x.jsonl:2: field 'steps[0].procedure'"),
        ('["not", "an", "object"]', "x.jsonl:2: expected a JSON object"),
        (
            '{"query": "q", "steps": [{"procedure": "p", "response": "r", "result": {"t": 1}}]}',
            "x.jsonl:2: field 'steps[0].result': must be a string",
        ),
    ],
)
def test_malformed_line_is_named_by_file_line_and_field(tmp_path, line, message):
    good = '{"query": "q", "steps": [{"procedure": "p", "response": "r"}]}'
    path = write_lines(tmp_path / "x.jsonl", good, line)
    with pytest.raises(DataError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_examples(path)


def test_unknown_procedure_at_eval_names_the_line(tmp_path):
    path = write_lines(
        tmp_path / "x.jsonl", json.dumps({"query": "q", "steps": [{"procedure": "nope", "response": "r"}]})
    )
    with pytest.raises(DataError, match=r"x.jsonl:1: field 'steps\[0\].procedure': unknown procedure 'nope'"):
        load_examples(path, known_procedures=["reverse"])


def test_missing_and_empty_files_are_reported(tmp_path):
    with pytest.raises(DataError, match="file not found"):
        load_examples(tmp_path / "absent.jsonl")
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DataError, match="no examples"):
        load_examples(tmp_path / "empty.jsonl")


def test_catalog_maps_names_to_descriptions_and_rejects_nameless_lines(tmp_path):
    path = write_lines(tmp_path / "c.jsonl", '{"name": "reverse", "description": "Reverse a word."}')
    assert load_catalog(path) == {"reverse": "Reverse a word."}
    bad = write_lines(tmp_path / "bad.jsonl", '{"description": "x"}')
    with pytest.raises(DataError, match="bad.jsonl:1: field 'name'"):
        load_catalog(bad)


@pytest.mark.parametrize(
    "response, arguments",
    [
        ('{"name": "f", "arguments": {"b": 1, "a": [2, "x"]}}', '{"b":1,"a":[2,"x"]}'),
        ('{"name": "g", "arguments": {}}', None),  # another tool's call
        ('{"name": "f", "arguments": {}, "id": 3}', None),  # more than a call
        ('{"name": "f", "arguments": "x=1"}', None),
        ("f(x=1)", None),
    ],
)
def test_call_arguments_are_the_compact_json_of_a_call_of_the_steps_own_procedure(response, arguments):
    assert Step("f", response).call_arguments == arguments


def test_tool_procedures_are_those_whose_every_step_calls_them():
    examples = [
        Example("q1", (Step("f", call_json("f", {"x": 1})), Step("g", call_json("g", {})))),
        Example("q2", (Step("g", "plain text"),)),
        Example("q3", (Step("h", "text"),)),
    ]
    assert tool_procedures(examples) == {"f"}


@pytest.mark.parametrize(
    "generated, call",
    [
        ('{"x": 1, "y": "a"}', '{"name":"f","arguments":{"x":1,"y":"a"}}'),
        ('{"x": 1', '{"name":"f","arguments":{"x": 1}'),  # not JSON: kept verbatim, so the call does not parse
    ],
)
def test_assemble_call_wraps_generated_arguments_in_the_tools_call(generated, call):
    assert assemble_call("f", generated) == call


def test_a_steps_result_round_trips_and_a_step_without_one_writes_no_result_field(tmp_path):
    examples = [Example("q", (Step("search", "r1", result='{"id": 7}'), Step("book", "r2")))]
    save_examples(examples, tmp_path / "x.jsonl")
    assert load_examples(tmp_path / "x.jsonl") == examples
    assert "result" not in json.loads((tmp_path / "x.jsonl").read_text())["steps"][1]


def test_a_final_answer_after_the_last_result_round_trips_and_one_without_a_result_before_it_is_refused(tmp_path):
    examples = [Example("q", (Step("search", "r1", result='{"id": 7}'),), answer="Found 7.")]
    save_examples(examples, tmp_path / "x.jsonl")
    assert load_examples(tmp_path / "x.jsonl") == examples
    write_lines(tmp_path / "y.jsonl", '{"query": "q", "steps": [{"procedure": "p", "response": "r"}], "answer": "a"}')
    with pytest.raises(DataError, match=r"y.jsonl:1: field 'answer': .* steps\[0\] has no 'result'"):
        load_examples(tmp_path / "y.jsonl")


def test_catalog_schemas_are_read_from_parameters_and_a_non_object_is_refused(tmp_path):
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    path = write_lines(
        tmp_path / "c.jsonl", json.dumps({"name": "weather", "parameters": schema}), '{"name": "reverse"}'
    )
    assert load_schemas(path) == {"weather": schema}
    bad = write_lines(tmp_path / "bad.jsonl", '{"name": "weather", "parameters": "city"}')
    with pytest.raises(DataError, match="bad.jsonl:1: field 'parameters': must be a JSON schema object"):
        load_schemas(bad)


def test_a_catalog_may_be_one_json_list_and_a_bad_entry_there_is_named_by_its_number(tmp_path):
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    entries = [{"name": "weather", "description": "Weather now.", "parameters": schema}, {"name": "reverse"}]
    (tmp_path / "c.json").write_text(json.dumps(entries, indent=2))
    assert load_catalog(tmp_path / "c.json") == {"weather": "Weather now.", "reverse": ""}
    assert load_schemas(tmp_path / "c.json") == {"weather": schema}
    (tmp_path / "bad.json").write_text(json.dumps([entries[0], {"description": "no name"}]))
    with pytest.raises(DataError, match="bad.json:2: field 'name': missing or empty"):
        load_catalog(tmp_path / "bad.json")


def test_schema_order_puts_the_schemas_keys_first_in_its_order():
    schema = {"properties": {"a": {}, "b": {}, "c": {}}}
    assert list(schema_order({"x": 0, "c": 1, "a": 2}, schema)) == ["a", "c", "x"]
