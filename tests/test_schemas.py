"""JSON schemas from users: checked (features the grammar backend enforces, references resolved, bounded), compiled
within a budget and cached (failures too), refused with an error naming the field and keyword."""

import json
import re

import pytest
import torch
import xgrammar
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from helpers import Measure
from pydantic import BaseModel

from tokmem.decoding.conversation import conversation_ids
from tokmem.data.procedures import load_schemas
from tokmem.errors import DataError
from tokmem.decoding.grammar import ArgumentGrammar, Grammars
from tokmem.schemas import Budget, SchemaError, check_schema, decoding_schema, shared_leaves


class Tree(BaseModel):
    label: str
    children: list["Tree"] = []


@pytest.fixture(scope="module")
def grammars(backbone):
    return Grammars(backbone.tokenizer, backbone.vocab_size)


def accepts(compiled, text: str) -> bool:
    """Whether the grammar takes ``text`` whole (and nothing more is needed)."""
    matcher = xgrammar.GrammarMatcher(compiled)
    return matcher.accept_string(text) and matcher.is_completed()


def test_a_pydantic_schema_with_defs_compiles_and_binds_its_nested_models(grammars):
    compiled = grammars.arguments(Measure.model_json_schema(), references=False)
    assert accepts(compiled, '{"value":2.5,"unit":{"name":"m","factor":1},"alternatives":[{"name":"cm","factor":100}]}')
    assert not accepts(compiled, '{"value":2.5,"unit":{"name":"m"}}')  # the nested model's required key is missing


def test_a_recursive_model_compiles_without_being_expanded(grammars):
    schema = decoding_schema(Tree.model_json_schema(), references=False)
    assert list(schema["$defs"].values())[0]["properties"]["children"]["items"] == {"$ref": "#/$defs/ref0"}
    compiled = grammars.arguments(Tree.model_json_schema(), references=False)
    assert accepts(compiled, '{"label":"a","children":[{"label":"b","children":[{"label":"c"}]}]}')


def test_references_in_definitions_and_json_pointers_resolve_into_one_root_defs():
    schema = {
        "type": "object",
        "properties": {"a": {"$ref": "#/definitions/A"}, "b": {"$ref": "#/properties/a"}},
        "definitions": {"A": {"type": "integer", "title": "dropped"}},
    }
    checked = check_schema(schema)
    assert "definitions" not in checked and sorted(checked["$defs"].values(), key=str) == [
        {"$ref": "#/$defs/ref0"},
        {"type": "integer"},
    ]


@pytest.mark.parametrize(
    "spec, field, says",
    [
        ({"not": {"type": "string"}}, "s.not", "keyword 'not' is not supported"),
        ({"type": "integer", "if": {"minimum": 1}}, "s.if", "keyword 'if' is not supported"),
        ({"type": "array", "uniqueItems": True}, "s.uniqueItems", "'uniqueItems' is not supported"),
        ({"type": "array", "contains": {"type": "integer"}}, "s.contains", "'contains' is not supported"),
        ({"type": "object", "dependentRequired": {"a": ["b"]}}, "s.dependentRequired", "not supported"),
        ({"allOf": [{"type": "integer"}, {"minimum": 1}]}, "s.allOf", "more than one schema"),
        ({"type": "string", "format": "credit-card"}, "s.format", "not a supported format"),
        ({"type": "string", "format": []}, "s.format", "not a supported format"),
        ({"$ref": "https://example.com/s.json"}, "s.$ref", "only references within the schema"),
        ({"$ref": "#/$defs/Missing"}, "s.$ref", "points at nothing"),
        ({"type": "array", "items": [{"type": "integer"}]}, "s.items", "use 'prefixItems'"),
        ({"type": "number", "multipleOf": 0.5}, "s.multipleOf", "for type 'integer' only"),
        ({"type": "float"}, "s.type", "must be one of"),
        ({"type": "string", "pattern": "^[a-z]{20000}$"}, "s.pattern", "repetition {20000} is over the limit of 128"),
        ({"type": "string", "minLength": -1}, "s.minLength", "whole number"),
        ({"type": "string", "pattern": 5}, "s.pattern", "must be a regular expression"),
    ],
)
def test_what_the_backend_would_ignore_or_fail_on_is_refused_naming_the_field_and_keyword(spec, field, says):
    with pytest.raises(SchemaError, match=f"^{re.escape(f'parameters.properties.{field}: ')}.*{re.escape(says)}"):
        decoding_schema({"type": "object", "properties": {"s": spec}})


def test_a_schema_over_the_size_or_depth_budget_is_refused():
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(5000)}}
    with pytest.raises(SchemaError, match="the limit is 65536"):
        check_schema(wide)
    deep = {"type": "string"}
    for _ in range(40):
        deep = {"type": "array", "items": deep}
    with pytest.raises(SchemaError, match="nest deeper than the limit of 32"):
        check_schema(deep)
    with pytest.raises(SchemaError, match="nested too deep"):
        check_schema(_nested(5000))


def _nested(depth: int) -> dict:
    schema: dict = {}
    for _ in range(depth):
        schema = {"items": schema}
    return schema


def test_a_backend_failure_is_a_schema_error_and_is_cached(grammars):
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "(("}}}
    with pytest.raises(SchemaError, match="parameters: the grammar backend cannot compile it: Regex parsing error"):
        grammars.arguments(schema)
    cached = len(grammars.compiled)
    with pytest.raises(SchemaError, match="Regex parsing error"):
        grammars.arguments(schema)
    assert len(grammars.compiled) == cached


def test_a_compile_over_the_time_budget_is_refused_and_stays_refused(backbone):
    grammars = Grammars(backbone.tokenizer, backbone.vocab_size, Budget(seconds=0.001))
    costly = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^([a-z]{128}){128}$"}}}
    for _ in range(2):
        with pytest.raises(SchemaError, match="compiling the schema took longer than the limit of 0.001 s"):
            grammars.arguments(costly)


def test_offline_decoding_waits_for_a_costly_compile_that_the_server_refuses(backbone):
    """A bank's own schemas must compile however long they take offline (chat, eval, studies); only the server,
    where one client's schema would hold the others up, sets a limit."""
    from tokmem.serve.config import ServeConfig

    costly = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^([a-z]{128}){128}$"}}}
    server = Grammars(
        backbone.tokenizer, backbone.vocab_size, ServeConfig(banks="b", schema_seconds=0.001).schema_budget
    )
    with pytest.raises(SchemaError, match="took longer than the limit of 0.001 s"):
        server.arguments(costly)
    offline = Grammars(backbone.tokenizer, backbone.vocab_size)
    assert offline.budget.seconds is None and ServeConfig(banks="b").schema_seconds == 5.0
    assert offline.arguments(costly) is not None


def test_a_catalog_schema_that_cannot_decode_names_the_line_tool_and_field(tmp_path):
    path = tmp_path / "catalog.jsonl"
    good = {"name": "ok", "parameters": Measure.model_json_schema()}
    bad = {"name": "when", "parameters": {"type": "object", "properties": {"d": {"type": "string", "not": {}}}}}
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(SchemaError, match=r"catalog.jsonl:2: tool 'when': parameters.properties.d.not: the keyword"):
        load_schemas(path)


def test_call_arguments_nested_too_deep_are_refused_naming_the_field(backbone):
    import tokmem

    model = tokmem.create(backbone)
    model.bank.add(["f"], backbone.mean_embedding(), kinds=["tool"])
    deep = '{"a":' + "[" * 10_000 + "]" * 10_000 + "}"
    call = {"id": "a", "type": "function", "function": {"name": "f", "arguments": deep}}
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "a", "content": "done"},
    ]
    with pytest.raises(DataError, match=r"messages\[1\].tool_calls\[0\].function.arguments: nested too deep"):
        conversation_ids(model, messages)


@pytest.mark.parametrize(
    "defs",
    [{"A": {"$ref": "#/$defs/A"}}, {"A": {"$ref": "#/$defs/B", "title": "a"}, "B": {"$ref": "#/$defs/A"}}],
    ids=["itself", "each-other"],
)
def test_references_that_only_point_at_each_other_are_refused(defs):
    with pytest.raises(SchemaError, match="only point at each other"):
        decoding_schema({"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "$defs": defs})


def test_a_row_whose_grammar_admits_no_token_goes_free_instead_of_masking_everything(backbone):
    """A grammar with a dead end (compiled past the door's checks, as no schema that passes them should make one):
    the row is left unconstrained, never all -inf (which sampling would turn into NaN)."""
    grammars = Grammars(backbone.tokenizer, backbone.vocab_size)
    cycle = {
        "type": "object",
        "properties": {"a": {"anyOf": [{"$ref": "#/$defs/A"}]}},
        "$defs": {"A": {"anyOf": [{"$ref": "#/$defs/A"}]}},
    }
    dead = grammars.compiler.compile_json_schema(json.dumps(cycle), any_whitespace=False, separators=(",", ":"))
    vocab, eos = backbone.vocab_size, backbone.eos_token_id
    grammar = ArgumentGrammar([[dead]], vocab, eos)
    grammar.advance(torch.tensor([vocab]))
    for token in backbone.tokenizer('{"a":', add_special_tokens=False)["input_ids"]:
        grammar.advance(torch.tensor([token]))
    logits = grammar.constrain(torch.zeros(1, vocab + 1))
    assert grammar.matchers == [None] and torch.isfinite(logits).all()


KEYWORDS = st.sampled_from(
    ["type", "properties", "required", "items", "anyOf", "allOf", "$ref", "$defs", "enum", "const", "pattern"]
    + ["format", "minLength", "maxItems", "minimum", "multipleOf", "additionalProperties", "prefixItems", "not", "x"]
)
VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats()
    | st.sampled_from(["#", "#/$defs/a", "string", "object", "a{200}"]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(KEYWORDS | st.sampled_from(["a", "b"]), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(st.dictionaries(KEYWORDS, VALUES, max_size=5))
def test_any_json_as_a_schema_compiles_or_is_a_schema_error_never_another_exception(grammars, schema):
    try:
        grammars.arguments({"type": "object", "properties": {"s": schema}})
    except SchemaError:
        pass


def test_repeated_string_and_integer_leaves_are_compiled_once_and_the_calls_accepted_stay_the_same(backbone):
    parameters = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "where"},
            "country": {"type": "string"},
            "code": {"type": "string", "maxLength": 3},
            "adults": {"type": "integer"},
            "rooms": {"type": "integer", "title": "rooms"},
        },
        "required": ["city", "adults"],
    }
    schema = decoding_schema(parameters)
    shared = shared_leaves(schema)
    leaves = [d for d in shared["$defs"].values()]
    assert {d["type"] for d in leaves} == {"string", "integer"} and len(json.dumps(shared)) < len(json.dumps(schema))
    info = xgrammar.TokenizerInfo.from_huggingface(backbone.tokenizer, vocab_size=backbone.vocab_size)
    compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
    plain, hoisted = (
        compiler.compile_json_schema(json.dumps(s), any_whitespace=False, separators=(",", ":"), strict_mode=False)
        for s in (schema, shared)
    )
    calls = [
        '{"city":"Oslo","adults":2}',
        '{"city":"' + "a" * 128 + '","adults":2}',  # the default string bound
        '{"city":"' + "a" * 129 + '","adults":2}',  # past it
        '{"city":"Oslo","code":"NOR","adults":2,"rooms":1}',
        '{"city":"Oslo","code":"NORW","adults":2}',  # past the schema's own maxLength
        '{"city":"$var1.name$","adults":"$var2.count$"}',  # references to earlier results
        '{"city":"Oslo","adults":"two"}',
        '{"city":"Oslo"}',
    ]
    assert [accepts(hoisted, c) for c in calls] == [accepts(plain, c) for c in calls]
    assert [accepts(hoisted, c) for c in calls] == [True, True, False, True, False, True, False, False]
