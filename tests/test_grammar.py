"""Schema-bound tool arguments: the grammar module over token ids and logits, and decoding under it."""

import json
import re

import pytest
import torch
import xgrammar
from helpers import random_rows

import tokmem
from tokmem import DecodeConfig, Example, Step, TrainConfig
from tokmem.decoding.tool_rules import tool_schemas
from tokmem.decoding.grammar import ArgumentGrammar, grammars_for
from tokmem.data.procedures import schema_order
from tokmem.schemas import (
    INTEGER_BOUND,
    KEY_ORDERS,
    LEARNED_FLOOR,
    REFERENCE,
    STRING_BOUND,
    UNTRAINED,
    SchemaError,
    bounded,
    decoding_schema,
)

CITY = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Oslo", "Rome"]}}, "required": ["city"]}
COUNT = {
    "type": "object",
    "properties": {"n": {"type": "integer"}, "unit": {"type": "string"}},
    "required": ["n", "unit"],
}


@pytest.fixture
def tool_model(lively_backbone):
    """Two tool rows with schemas and one without, random rows that route and write words on the lively backbone."""
    model = tokmem.create(lively_backbone)
    model.bank.add(
        ["city", "count", "free"], lively_backbone.mean_embedding(), kinds=["tool"] * 3, schemas=[CITY, COUNT, None]
    )
    random_rows(model.bank, scale=0.7)
    return model


def valid(arguments: dict, schema: dict) -> bool:
    """Whether the arguments meet the schema: its keys only, the required ones, each value of its type and enum or
    a reference to an earlier result."""
    properties = schema["properties"]
    types = {"string": str, "integer": int}

    def fits(key, value):
        spec = properties[key]
        return (
            isinstance(value, types[spec["type"]])
            and value in spec.get("enum", [value])
            or isinstance(value, str)
            and re.fullmatch(REFERENCE["pattern"], value) is not None
        )

    return set(schema["required"]) <= set(arguments) <= set(properties) and all(
        fits(k, v) for k, v in arguments.items()
    )


def call_fits(generation, schema: dict) -> bool:
    """Whether the generation's first call has arguments (a JSON object) that meet ``schema``."""
    try:
        arguments = json.loads(generation.trace[0].text)["arguments"]
    except (ValueError, TypeError):
        return False
    return isinstance(arguments, dict) and valid(arguments, schema)


@pytest.mark.parametrize("tool, schema", [("city", CITY), ("count", COUNT)])
def test_a_tools_arguments_decode_under_its_schema(tool_model, tool, schema):
    config = DecodeConfig(max_new_tokens=200, max_steps=1)  # room for the longest reference ("$var…$") to close
    generation = tokmem.generate(tool_model, ["What now?"], config, procedure=tool)[0]
    assert call_fits(generation, schema)


def test_without_the_schema_the_same_model_writes_no_valid_arguments(tool_model):
    config = DecodeConfig(max_new_tokens=40, max_steps=1, schema=False)
    assert not call_fits(tokmem.generate(tool_model, ["What now?"], config, procedure="city")[0], CITY)


def test_a_tool_without_a_schema_decodes_as_with_schemas_off(tool_model):
    on = tokmem.generate(tool_model, ["What now?"], DecodeConfig(max_new_tokens=12, max_steps=1), procedure="free")
    off = tokmem.generate(
        tool_model, ["What now?"], DecodeConfig(max_new_tokens=12, max_steps=1, schema=False), procedure="free"
    )
    assert on[0].trace == off[0].trace


def test_batched_schema_bound_generation_equals_one_query_at_a_time(tool_model):
    queries = ["What now?", "hi", "Count the apples, please."]
    config = DecodeConfig(max_new_tokens=40, max_steps=2, threshold=0.0)
    batched = tokmem.generate(tool_model, queries, config)
    alone = [tokmem.generate(tool_model, [q], config)[0] for q in queries]
    assert [g.trace for g in batched] == [g.trace for g in alone]


def test_each_row_is_masked_by_its_own_tools_grammar_and_memory_tokens_wait_for_the_json_to_close(tool_model):
    vocab, eos = tool_model.vocab_size, tool_model.backbone.eos_token_id
    compiled = grammars_for(tool_model.backbone.tokenizer, vocab).rows(tool_model.bank.schemas)
    grammar = ArgumentGrammar([compiled] * 3, vocab, eos)
    grammar.advance(torch.tensor([vocab + 0, vocab + 1, vocab + 2]))  # city, count, free (no schema)
    logits = grammar.constrain(torch.zeros(3, vocab + 3))
    brace = tool_model.backbone.tokenizer.convert_tokens_to_ids("{")
    allowed = logits > float("-inf")
    assert allowed[0, :vocab].nonzero().flatten().tolist() == [brace] and not allowed[0, vocab:].any()
    assert allowed[2].all()  # the tool without a schema is not constrained
    for token in tool_model.backbone.tokenizer('{"city":"Rome"}', add_special_tokens=False)["input_ids"]:
        grammar.advance(torch.tensor([token, eos, eos]))
    closed = grammar.constrain(torch.zeros(3, vocab + 3))[0] > float("-inf")
    assert closed[:vocab].nonzero().flatten().tolist() == [eos] and closed[vocab:].all()


def test_decoding_schema_forbids_extra_keys_and_accepts_references_to_earlier_results():
    schema = decoding_schema(COUNT)
    assert schema["additionalProperties"] is False and schema["required"] == ["n", "unit"]
    assert schema["properties"]["n"]["anyOf"] == [bounded(COUNT["properties"]["n"]), REFERENCE]
    assert decoding_schema(COUNT, references=False)["properties"]["n"] == bounded(COUNT["properties"]["n"])


def test_a_row_without_references_must_write_a_value_where_a_row_with_them_may_start_one(tool_model):
    vocab, eos, tokenizer = tool_model.vocab_size, tool_model.backbone.eos_token_id, tool_model.backbone.tokenizer
    grammars = grammars_for(tokenizer, vocab)
    with_references, values = (grammars.rows(tool_model.bank.schemas, references) for references in (True, False))
    grammar = ArgumentGrammar([with_references, values], vocab, eos)
    grammar.advance(torch.tensor([vocab + 1, vocab + 1]))  # count: {"n": integer, …}
    for token in tokenizer('{"n":', add_special_tokens=False)["input_ids"]:
        grammar.advance(torch.tensor([token, token]))
    allowed = grammar.constrain(torch.zeros(2, vocab + 3)) > float("-inf")
    quote, digit = tokenizer.convert_tokens_to_ids('"'), tokenizer.convert_tokens_to_ids("7")
    assert allowed[0, quote] and allowed[0, digit]  # "$var1.n$" or a number
    assert not allowed[1, quote] and allowed[1, digit]  # a number only


def test_a_response_row_is_json_from_its_first_token_and_leaves_memory_tokens_to_routing_until_then(tool_model):
    vocab, eos, tokenizer = tool_model.vocab_size, tool_model.backbone.eos_token_id, tool_model.backbone.tokenizer
    grammars = grammars_for(tokenizer, vocab)
    compiled = grammars.rows(tool_model.bank.schemas, references=False)
    grammar = ArgumentGrammar([compiled] * 3, vocab, eos, [grammars.compile(CITY), grammars.compile(CITY), None])
    first = grammar.constrain(torch.zeros(3, vocab + 3)) > float("-inf")
    brace = tokenizer.convert_tokens_to_ids("{")
    assert first[0, :vocab].nonzero().flatten().tolist() == [brace] and first[0, vocab:].all()  # JSON, or a tool
    assert first[2].all()  # a row without a response schema is free
    grammar.advance(torch.tensor([brace, vocab + 1, eos]))  # row 0 starts its JSON, row 1 calls count instead
    after = grammar.constrain(torch.zeros(3, vocab + 3)) > float("-inf")
    assert not after[0, brace] and not after[0, vocab:].any()  # inside the JSON: no memory token
    assert after[1, :vocab].nonzero().flatten().tolist() == [brace]  # count's arguments, under count's schema
    for token in tokenizer('"city":"Oslo"}', add_special_tokens=False)["input_ids"]:
        grammar.advance(torch.tensor([token, eos, eos]))
    closed = grammar.constrain(torch.zeros(3, vocab + 3))[0] > float("-inf")
    assert closed[:vocab].nonzero().flatten().tolist() == [eos]


# ---- bounds: a call always closes -------------------------------------------------------------------------------


def accepts(backbone, parameters: dict, text: str) -> bool:
    """Whether ``text`` is a complete call's arguments under ``parameters`` (compiled as decoding compiles them)."""
    compiled = grammars_for(backbone.tokenizer, backbone.vocab_size).arguments(parameters, references=False)
    matcher = xgrammar.GrammarMatcher(compiled)
    return matcher.accept_string(text) and matcher.accept_token(backbone.eos_token_id)


def one(spec: dict) -> dict:
    return {"type": "object", "properties": {"v": spec}, "required": ["v"]}


def test_a_string_without_a_bound_closes_after_the_default_bound(backbone):
    assert accepts(backbone, one({"type": "string"}), '{"v":"%s"}' % ("x" * STRING_BOUND))
    assert not accepts(backbone, one({"type": "string"}), '{"v":"%s"}' % ("x" * (STRING_BOUND + 1)))
    assert accepts(backbone, one({"type": "string"}), """{"v":"SELECT name FROM t WHERE city = 'Oslo'"}""")


def test_a_schemas_max_length_is_the_bound_and_a_bounded_string_is_valid_json(backbone):
    five = one({"type": "string", "minLength": 2, "maxLength": 5})
    assert accepts(backbone, five, '{"v":"abcde"}') and accepts(backbone, five, '{"v":"åé"}')
    assert not accepts(backbone, five, '{"v":"abcdef"}') and not accepts(backbone, five, '{"v":"a"}')
    assert not accepts(backbone, five, '{"v":"a\tb"}')  # a raw control character is not JSON


def test_integers_are_bounded_and_numbers_keep_every_decimal_a_result_gives(backbone):
    assert accepts(backbone, one({"type": "integer"}), '{"v":%d}' % -INTEGER_BOUND)
    assert not accepts(backbone, one({"type": "integer"}), '{"v":%d}' % (10 * INTEGER_BOUND))
    assert accepts(backbone, one({"type": "number"}), '{"v":-37.669123456789}')


def test_a_number_without_a_range_ends_after_16_digits_each_side_of_its_point(backbone):
    number = one({"type": "number"})
    assert accepts(backbone, number, '{"v":%s}' % ("9" * 16 + "." + "1" * 16))
    assert accepts(backbone, number, '{"v":-0.5e-300}') and accepts(backbone, one({}), '{"v":2.5}')
    assert not accepts(backbone, number, '{"v":%s}' % ("1" * 17))
    assert not accepts(backbone, number, '{"v":1.%s}' % ("0" * 17))
    assert not accepts(backbone, one({}), '{"v":%s}' % ("1" * 17))  # an untyped value too


def test_bounds_leave_patterns_enums_formats_and_set_ranges_alone_and_reach_nested_values():
    kept = [
        {"type": "string", "pattern": "^[a-z]+$"},
        {"type": "string", "enum": ["a"]},
        {"type": "string", "format": "date"},
        {"type": "integer", "minimum": 0},
    ]
    assert [bounded(spec) for spec in kept] == kept
    nested = {"type": "array", "items": {"type": "object", "properties": {"enum": {"type": "string"}}}}
    assert "pattern" in bounded(nested)["items"]["properties"]["enum"]
    assert nested == {"type": "array", "items": {"type": "object", "properties": {"enum": {"type": "string"}}}}


def test_training_keeps_in_the_banks_schema_a_bound_learned_from_the_values_its_calls_gave(backbone):
    find = {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "code": {"type": "string", "maxLength": 3},
            "note": {"type": "string"},
            "n": {"type": "integer"},
        },
    }
    calls = [{"city": "Oslo", "code": "OSL"}, {"city": "x" * LEARNED_FLOOR, "note": "$var1.note$", "n": 3}]
    examples = [Example(f"Find {c}", (Step("find", json.dumps({"name": "find", "arguments": c})),)) for c in calls]
    model = tokmem.create(backbone)
    tokmem.learn(model, examples, TrainConfig(epochs=1, progress=False), schemas={"find": find})
    kept = model.bank.schemas[model.bank.row("find")]["properties"]
    assert kept["city"] == {"type": "string", "maxLength": 2 * LEARNED_FLOOR}
    assert kept["code"] == find["properties"]["code"] and kept["n"] == find["properties"]["n"]
    assert kept["note"] == {"type": "string"}  # only a reference was given: the default bound
    city = {"type": "object", "properties": {"city": kept["city"]}, "required": ["city"]}
    assert accepts(backbone, city, '{"city":"%s"}' % ("x" * 2 * LEARNED_FLOOR))
    assert not accepts(backbone, city, '{"city":"%s"}' % ("x" * (2 * LEARNED_FLOOR + 1)))


def test_two_schemas_differing_only_in_key_order_compile_to_grammars_of_their_own_order(backbone):
    ab = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}
    ba = {**ab, "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}}}
    assert accepts(backbone, ab, '{"a":1,"b":2}') and not accepts(backbone, ab, '{"b":2,"a":1}')
    assert accepts(backbone, ba, '{"b":2,"a":1}') and not accepts(backbone, ba, '{"a":1,"b":2}')


def test_training_orders_the_banks_schema_as_its_calls_write_the_arguments(backbone):
    """The grammar writes keys in the schema's order: a bank's schema takes the order its training calls used, so a
    memory token is not forced into an order it never trained on."""
    rent = {
        "type": "object",
        "properties": {name: {"type": "string"} for name in ("drop_off", "note", "pick_up", "city")},
        "required": ["pick_up", "drop_off"],
    }
    calls = [{"city": "Oslo", "pick_up": "08:00", "drop_off": "09:00"}, {"pick_up": "10:00", "drop_off": "11:00"}]
    examples = [Example(f"Rent {c}", (Step("rent", json.dumps({"name": "rent", "arguments": c})),)) for c in calls]
    model = tokmem.create(backbone)
    tokmem.learn(model, examples, TrainConfig(epochs=1, progress=False), schemas={"rent": rent})
    kept = model.bank.schemas[model.bank.row("rent")]
    assert list(kept["properties"]) == ["city", "pick_up", "drop_off"]  # no call gave "note"
    assert kept["required"] == rent["required"] and list(rent["properties"])[0] == "drop_off"  # the caller's untouched
    assert accepts(backbone, kept, '{"pick_up":"10:00","drop_off":"11:00"}')
    assert not accepts(backbone, rent, '{"pick_up":"10:00","drop_off":"11:00"}')
    schema_order = tokmem.create(backbone)
    config = TrainConfig(epochs=1, progress=False, key_order="schema")
    tokmem.learn(schema_order, examples, config, schemas={"rent": rent})
    assert list(schema_order.bank.schemas[0]["properties"]) == ["drop_off", "pick_up", "city"]  # in the spec's


def test_an_optional_argument_no_training_call_gave_is_kept_out_of_the_grammar_but_a_client_may_still_name_it(
    backbone,
):
    """Offered a key it never trained on, a memory token writes garbage (``price_min: 1000000000000000``)."""
    hotel = {
        "type": "object",
        "properties": {name: {"type": "integer"} for name in ("dest", "adults", "price_min")},
        "required": ["dest"],
    }
    calls = [{"dest": 1, "adults": 2}, {"dest": 3}]
    examples = [Example(f"Hotel {c}", (Step("hotel", json.dumps({"name": "hotel", "arguments": c})),)) for c in calls]
    model = tokmem.create(backbone)
    tokmem.learn(model, examples, TrainConfig(epochs=1, progress=False), schemas={"hotel": hotel})
    kept = model.bank.schemas[0]
    assert list(kept["properties"]) == ["dest", "adults"] and kept[UNTRAINED] == {"price_min": {"type": "integer"}}
    assert accepts(backbone, kept, '{"dest":1,"adults":2}') and not accepts(backbone, kept, '{"dest":1,"price_min":5}')
    client = {"type": "function", "function": {"name": "hotel", "parameters": hotel}}
    assert list(tool_schemas(model, [client])[0]["properties"]) == ["dest", "adults"]  # an optional one left out
    insisting = json.loads(json.dumps(client))
    insisting["function"]["parameters"]["required"] = ["dest", "price_min"]
    assert list(tool_schemas(model, [insisting])[0]["properties"]) == ["dest", "adults", "price_min"]


HOTEL_CALLS = [  # two templates, each with its own key order (as ComplexFuncBench's Search_Hotels)
    {"search_type": "city", "dest_id": "7", "adults": "2", "children": "5"},
    {"dest_id": "7", "search_type": "city", "adults": "2", "sort_by": "price"},
    {"dest_id": "9", "search_type": "district"},
]


def test_a_bank_trained_in_each_calls_own_order_decodes_any_order_it_trained_on_and_no_other(backbone):
    hotel = {
        "type": "object",
        "properties": {
            name: {"type": "string"} for name in ("sort_by", "dest_id", "children", "adults", "search_type")
        },
        "required": ["dest_id", "search_type"],
    }
    examples = [
        Example(f"Hotel {k}", (Step("hotel", json.dumps({"name": "hotel", "arguments": c})),))
        for k, c in enumerate(HOTEL_CALLS)
    ]
    model = tokmem.create(backbone)
    tokmem.learn(model, examples, TrainConfig(epochs=1, progress=False, key_order="given"), schemas={"hotel": hotel})
    kept = model.bank.schemas[model.bank.row("hotel")]
    assert [order[:2] for order in kept[KEY_ORDERS]] == [["dest_id", "search_type"], ["search_type", "dest_id"]]
    for call in HOTEL_CALLS:
        assert list(schema_order(call, kept)) == list(call)  # trained as written
        assert accepts(backbone, kept, json.dumps(call, separators=(",", ":")))  # and decodable so
    assert accepts(backbone, kept, '{"search_type":"city","dest_id":"7","sort_by":"price"}')  # an option skipped
    assert not accepts(backbone, kept, '{"search_type":"city","adults":"2"}')  # a required key left out
    assert not accepts(backbone, kept, '{"dest_id":"7","dest_id":"7","search_type":"city"}')  # a key twice
    assert not accepts(backbone, kept, '{"adults":"2","dest_id":"7","search_type":"city"}')  # an order never trained
    one_order = tokmem.create(backbone)
    tokmem.learn(one_order, examples, TrainConfig(epochs=1, progress=False), schemas={"hotel": hotel})
    assert KEY_ORDERS not in one_order.bank.schemas[0]  # the default: one order, the calls' mean
    assert not accepts(backbone, one_order.bank.schemas[0], json.dumps(HOTEL_CALLS[0], separators=(",", ":")))


@pytest.mark.parametrize("orders", [["a"], [["a"]], [["a", "b", "b"]], [["a", 1]]])
def test_key_orders_that_are_not_orders_of_all_the_properties_are_refused_naming_the_field(orders):
    schema = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}, KEY_ORDERS: orders}
    with pytest.raises(SchemaError, match=f"tools\\[0\\].{KEY_ORDERS}: must be a list of orders"):
        decoding_schema(schema, where="tools[0]")
