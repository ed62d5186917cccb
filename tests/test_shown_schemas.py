"""A bank that shows schemas (``tokmem+schema``): each tool call laid out as memory token, the tool's schema
(context), the arguments — in training, in a conversation's history, and in decoding (``tokmem.chat``)."""

import functools
import json
from pathlib import Path

import pytest
from helpers import CITY, city_count_chain, city_count_model, example_messages

import tokmem
from tokmem import ChatCache, DecodeConfig, Example, Step
from tokmem.backbones import load_backbone
from tokmem.bank.memory_bank import MemoryBank
from tokmem.decoding.conversation import conversation_ids
from tokmem.errors import BackboneError, BankError
from tokmem.schemas import learned_schema
from tokmem.training.sequences import IGNORE, TruncationCount, encode, shown_schema_ids
from research.studies.compositional_config import make_config
from research.studies.tool_setup import tool_data

CONFIG = DecodeConfig(max_new_tokens=40, references=False)
CHAIN = city_count_chain()
QUERY = example_messages(CHAIN)[:1]


def bank_model(backbone, shows_schemas: bool):
    return city_count_model(backbone, shows_schemas=shows_schemas)


@pytest.fixture
def shown(lively_backbone):
    return bank_model(lively_backbone, shows_schemas=True)


def test_training_lays_out_each_call_as_memory_token_schema_then_arguments_the_schema_not_a_target(shown):
    tokenizer = shown.backbone.tokenizer
    encoded = encode(CHAIN, tokenizer, shown.memory_id, 1024, tools=shown.bank.tool_schemas(), show_schemas=True)
    schema = shown_schema_ids(tokenizer, CITY)
    start = encoded.input_ids.index(shown.memory_id("city"))
    arguments = tokenizer('{"city":"Rome"}', add_special_tokens=False)["input_ids"]
    assert encoded.input_ids[start + 1 : start + 1 + len(schema) + len(arguments)] == schema + arguments
    assert encoded.labels[start] == shown.memory_id("city")
    assert encoded.labels[start + 1 : start + 1 + len(schema)] == [IGNORE] * len(schema)
    assert encoded.labels[start + 1 + len(schema) : start + 1 + len(schema) + len(arguments)] == arguments


def test_a_conversation_is_laid_out_as_training_lays_out_the_chain_with_its_schemas_shown(shown):
    trained = encode(
        CHAIN, shown.backbone.tokenizer, shown.memory_id, 1024, tools=shown.bank.tool_schemas(), show_schemas=True
    )
    messages = example_messages(CHAIN)
    assert conversation_ids(shown, messages) == trained.input_ids[:-1]


def test_routing_picks_the_tool_the_same_rows_pick_without_the_schema_and_the_arguments_follow_it(lively_backbone):
    plain, shown = bank_model(lively_backbone, False), bank_model(lively_backbone, True)
    for tool_choice in ("required", "auto"):
        without = tokmem.chat(plain, QUERY, tool_choice=tool_choice, config=CONFIG)
        with_schema = tokmem.chat(shown, QUERY, tool_choice=tool_choice, config=CONFIG)
        assert [c.name for c in with_schema.tool_calls] == [c.name for c in without.tool_calls][:1]
    call = tokmem.chat(shown, QUERY, tool_choice={"type": "function", "function": {"name": "city"}}, config=CONFIG)
    assert len(call.tool_calls) == 1 and json.loads(call.tool_calls[0].arguments)["city"] in ("Oslo", "Rome")


def test_the_cache_holds_the_shown_schema_and_the_next_turn_encodes_only_its_new_tokens(shown):
    cache = ChatCache()
    first = tokmem.chat(shown, QUERY, tool_choice="required", config=CONFIG, cache=cache)
    messages = [*QUERY, first.message, {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "sunny"}]
    ids = conversation_ids(shown, messages)
    held = len(cache.ids)
    assert ids[:held] == cache.ids  # the memory token, the schema and the arguments, as the history lays them out
    second = tokmem.chat(shown, messages, tool_choice="required", config=CONFIG, cache=cache)
    schema = shown.bank.schemas[shown.bank.row(second.tool_calls[0].name)]
    shown_tokens = 1 + len(shown_schema_ids(shown.backbone.tokenizer, schema))  # the second pass's memory token, schema
    assert cache.prefilled == len(ids) - held + shown_tokens
    assert second == tokmem.chat(shown, messages, tool_choice="required", config=CONFIG)


def test_conversations_answered_together_get_the_answers_each_gets_alone(shown):
    conversations = [QUERY, [{"role": "user", "content": "Count the apples in Oslo, please."}]]
    for tool_choice in ("required", "none"):
        together = tokmem.chat_batch(shown, conversations, tool_choice=tool_choice, config=CONFIG)
        assert together == [tokmem.chat(shown, c, tool_choice=tool_choice, config=CONFIG) for c in conversations]
    assert all(reply.content is not None and not reply.tool_calls for reply in together)


def test_the_bank_file_keeps_that_it_shows_schemas_and_the_decoders_that_cannot_lay_it_out_refuse_it(shown, tmp_path):
    path = shown.bank.save(tmp_path / "shown.safetensors")
    assert (
        MemoryBank.load(path).shows_schemas
        and json.loads(path.with_suffix(".safetensors.json").read_text())["shows_schemas"]
    )
    with pytest.raises(BankError, match="generate .* does not decode such a bank"):
        tokmem.generate(shown, ["Weather in Rome?"])
    with pytest.raises(BankError, match="shows its tools' schemas"):
        shown.bank.merge(MemoryBank(shown.bank.hidden_size, backbone=shown.bank.backbone))


def test_a_bank_file_whose_shows_schemas_is_not_true_or_false_is_refused_naming_the_field(shown, tmp_path):
    path = shown.bank.save(tmp_path / "shown.safetensors")
    meta_path = path.with_suffix(".safetensors.json")
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "shows_schemas": "yes"}))
    with pytest.raises(BankError, match="field 'shows_schemas' must be true or false"):
        MemoryBank.load(path)


def test_training_a_bank_that_shows_schemas_lowers_its_loss(shown):
    report = tokmem.train(shown, [CHAIN] * 4, tokmem.TrainConfig(epochs=6, batch_size=2, lr=5e-2))
    assert report.losses[-1] < report.losses[0]


def test_eval_scores_a_bank_that_shows_schemas_in_the_tool_loop_and_refuses_examples_without_results(shown):
    from tokmem.errors import DataError
    from tokmem.eval.evaluate import evaluate

    result = evaluate(shown, [CHAIN], DecodeConfig(max_new_tokens=40))
    assert result["calls_per_step"]["steps"]["all"] == 2
    row = result["predictions"][0]
    assert row["predicted"] and set(row["predicted"]) <= {"city", "count"}  # the end-to-end calls' tools
    unanswered = Example("Weather in Rome?", (Step("city", '{"name":"city","arguments":{"city":"Rome"}}'),))
    with pytest.raises(DataError, match="1 of 2 examples are not tool calls with a result at every step"):
        evaluate(shown, [CHAIN, unanswered])


SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "function-calling"


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} is absent")
@pytest.mark.parametrize("backbone_name", ["smollm2-135m", "qwen2.5-coder-0.5b"])
def test_the_tool_loop_preset_keeps_every_training_record_whole_with_or_without_schemas(backbone_name):
    """At 1536 tokens the 0.5B's tokmem+schema records were cut (72 of 120), most down to one query token: the
    tool-loop preset's ``max_length`` must hold its records in either layout, at seeds 0-2."""
    try:
        tokenizer = load_backbone(backbone_name, device="cpu").tokenizer
    except BackboneError as err:  # the Qwen packages are optional (make qwen)
        pytest.skip(str(err))
    for seed in range(3):
        study = functools.partial(make_config, "cpu", dataset="complexfuncbench", backbone=backbone_name, seed=seed)
        data = tool_data(study(), (1, study().tools))
        for shown in (False, True):
            train = study(show_schemas=shown).train()
            schemas = {  # as the study's bank keeps them
                name: learned_schema(tool.get("parameters"), name, data.train, train.key_order)
                for name, tool in data.tools.items()
            }
            ids = {name: len(tokenizer) + k for k, name in enumerate(schemas)}
            cut = TruncationCount()
            for example in data.train:
                encode(example, tokenizer, ids.get, train.max_length, cut, schemas, train.result_tokens, shown)
            assert not cut, f"seed {seed}, shown {shown}: {cut.describe(len(data.train), train.max_length)}"
