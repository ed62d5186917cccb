"""tokmem.chat and run_tools: the conversation laid out as training lays it out, tool_choice, and the KV cache
reused across turns."""

import json
import math
from dataclasses import replace

import pytest
from helpers import PINGED, ping_bank, random_rows

import tokmem
from tokmem import ChatCache, DecodeConfig, Example, Step
from tokmem.decoding.tool_rules import Reply, ToolCall, answered_calls, without_repeats
from tokmem.decoding.conversation import conversation_ids
from tokmem.errors import DataError
from tokmem.training.sequences import encode

CITY = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Oslo", "Rome"]}}, "required": ["city"]}
COUNT = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
CONFIG = DecodeConfig(max_new_tokens=200)  # room for the longest reference ("$var…$") the grammar allows to close


@pytest.fixture
def model(lively_backbone):
    model = tokmem.create(lively_backbone)
    model.bank.add(
        ["city", "count", "chat"],
        lively_backbone.mean_embedding(),
        kinds=["tool", "tool", "text"],
        schemas=[CITY, COUNT, None],
    )
    random_rows(model.bank, scale=0.7)
    return model


def call(call_id, name, arguments) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


CONVERSATION = [
    {"role": "user", "content": "Weather in Rome, then count."},
    {"role": "assistant", "content": None, "tool_calls": [call("a", "city", {"city": "Rome"})]},
    {"role": "tool", "tool_call_id": "a", "content": "sunny"},
    {"role": "assistant", "content": None, "tool_calls": [call("b", "count", {"n": 3})]},
    {"role": "tool", "tool_call_id": "b", "content": "3 apples"},
]


CHAIN = Example(  # CONVERSATION as training data
    "Weather in Rome, then count.",
    (
        Step("city", '{"name":"city","arguments":{"city":"Rome"}}', result="sunny"),
        Step("count", '{"name":"count","arguments":{"n":3}}', result="3 apples"),
    ),
)


def test_a_conversation_is_laid_out_exactly_as_training_lays_out_the_chain_with_results(model):
    trained = encode(CHAIN, model.backbone.tokenizer, model.memory_id, 1024, tools=model.bank.tool_schemas())
    assert conversation_ids(model, CONVERSATION) == trained.input_ids[:-1]  # all but the final answer's EOS


@pytest.mark.slow
def test_a_conversation_on_qwen_is_laid_out_as_training_lays_it_out_with_results_in_tool_response_tags(qwen):
    model = tokmem.create(qwen)
    model.bank.add(["city", "count"], qwen.mean_embedding(), kinds=["tool", "tool"], schemas=[CITY, COUNT])
    trained = encode(CHAIN, qwen.tokenizer, model.memory_id, 1024, tools=model.bank.tool_schemas())
    ids = conversation_ids(model, CONVERSATION)
    assert ids == trained.input_ids[:-1]
    assert qwen.tokenizer.decode(ids).count("<tool_response>") == 2


def test_the_second_turn_encodes_only_the_new_tokens_and_answers_as_from_scratch(model):
    messages = CONVERSATION[:1]
    cache = ChatCache()
    first = tokmem.chat(model, messages, tool_choice="required", config=CONFIG, cache=cache)
    assert first.finish_reason == "tool_calls" and cache.prefilled == len(conversation_ids(model, messages))
    held = len(cache.ids)
    messages = [
        *messages,
        first.message,
        *({"role": "tool", "tool_call_id": c.id, "content": "done"} for c in first.tool_calls),
    ]
    second = tokmem.chat(model, messages, config=CONFIG, cache=cache)
    assert cache.prefilled == len(conversation_ids(model, messages)) - held  # the EOS and the result turn only
    assert cache.prefilled < held
    assert second == tokmem.chat(model, messages, config=CONFIG)


def test_tool_choice_none_answers_with_text_and_required_or_named_with_a_tool_call(model):
    messages = [{"role": "user", "content": "What now?"}]
    none = tokmem.chat(model, messages, tool_choice="none", config=CONFIG)
    assert none.tool_calls == [] and isinstance(none.content, str) and none.finish_reason in ("stop", "length")
    required = tokmem.chat(model, messages, tools=["count"], tool_choice="required", config=CONFIG)
    assert {c.name for c in required.tool_calls} == {"count"}
    named = tokmem.chat(model, messages, tool_choice={"type": "function", "function": {"name": "city"}}, config=CONFIG)
    assert named.tool_calls[0].name == "city" and json.loads(named.tool_calls[0].arguments)["city"]


@pytest.mark.parametrize(
    "tools, tool_choice, message",
    [
        (["weather"], "auto", "tools: 'weather' not a tool in the bank"),
        (["chat"], "auto", "tools: 'chat' not a tool in the bank"),
        (["count"], {"type": "function", "function": {"name": "city"}}, "tool_choice: .* one of the allowed tools"),
    ],
)
def test_unknown_tools_and_tool_choices_are_refused_by_name(model, tools, tool_choice, message):
    with pytest.raises(DataError, match=message):
        tokmem.chat(model, [{"role": "user", "content": "hi"}], tools=tools, tool_choice=tool_choice)


def test_a_call_without_its_result_is_refused_naming_the_message(model):
    with pytest.raises(DataError, match=r"messages\[1\]: no 'tool' message answers tool call\(s\) a"):
        conversation_ids(model, CONVERSATION[:2])


FOLLOW_UP = [
    *CONVERSATION,
    {"role": "assistant", "content": "Sunny, and 3."},
    {"role": "user", "content": "And in Oslo?"},
]


def test_the_user_may_go_on_after_the_answer_as_the_template_writes_a_next_user_turn(model):
    tokenizer = model.backbone.tokenizer
    ids = conversation_ids(model, FOLLOW_UP)
    before = conversation_ids(model, CONVERSATION)
    answer = tokenizer("Sunny, and 3.", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert ids[: len(before) + len(answer)] == before + answer
    plain = [FOLLOW_UP[0], {"role": "assistant", "content": "Sunny, and 3."}, FOLLOW_UP[-1]]
    rendered = tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)
    after_answer = rendered[rendered.index("Sunny, and 3." + tokenizer.eos_token) :].removeprefix(
        "Sunny, and 3." + tokenizer.eos_token
    )
    assert after_answer.startswith("\n<|im_start|>user\nAnd in Oslo?")
    assert tokenizer.decode(ids[len(before) + len(answer) :]) == after_answer
    reply = tokmem.chat(model, FOLLOW_UP, tool_choice="required", config=CONFIG)
    assert reply.tool_calls and reply.finish_reason == "tool_calls"


@pytest.mark.parametrize(
    "messages, message",
    [
        (
            [*CONVERSATION, {"role": "user", "content": "And Oslo?"}],
            r"messages\[5\]: after tool results, the assistant",
        ),
        (FOLLOW_UP[:-1], r"messages\[5\]: the conversation ends with the assistant's answer"),
        ([*FOLLOW_UP[:-1], {"role": "system", "content": "x"}], r"messages\[6\]: after the assistant's answer, a user"),
    ],
    ids=["user-before-the-answer", "ends-with-the-answer", "system-after-the-answer"],
)
def test_a_conversation_out_of_turn_after_tool_results_is_refused_naming_the_message(model, messages, message):
    with pytest.raises(DataError, match=message):
        conversation_ids(model, messages)


def test_run_tools_gives_each_call_to_the_executor_and_its_result_back_until_an_answer(model):
    seen = []

    def executor(name, arguments):
        seen.append((name, arguments))
        return f"result {len(seen)}"

    conversation = tokmem.run_tools(
        model, [{"role": "user", "content": "Weather in Rome?"}], executor, max_turns=3, config=CONFIG
    )
    calls = [c for m in conversation if m["role"] == "assistant" for c in m.get("tool_calls", [])]
    results = [m for m in conversation if m["role"] == "tool"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == seen
    assert [r["tool_call_id"] for r in results] == [c["id"] for c in calls]
    assert [r["content"] for r in results] == [f"result {k}" for k in range(1, len(seen) + 1)]
    assert sum(m["role"] == "assistant" for m in conversation) <= 3


MANY = [CONVERSATION[:1], CONVERSATION[:3], CONVERSATION, FOLLOW_UP, [{"role": "user", "content": "Count to 3."}]]


@pytest.mark.parametrize("tool_choice", ["required", "auto"])
def test_conversations_answered_together_get_the_answers_each_gets_alone(model, tool_choice):
    config = replace(CONFIG, batch_size=3)  # two batches, of three and two conversations of different lengths
    together = tokmem.chat_batch(model, MANY, tool_choice=tool_choice, config=config)
    assert together == [tokmem.chat(model, messages, tool_choice=tool_choice, config=CONFIG) for messages in MANY]
    assert any(reply.tool_calls for reply in together)


def test_caches_filled_together_hold_each_conversation_and_answer_and_serve_the_next_turn(model):
    starts = [CONVERSATION[:1], [{"role": "user", "content": "Count to 3."}]]
    caches = [ChatCache(), ChatCache()]
    first = tokmem.chat_batch(model, starts, tool_choice="required", config=CONFIG, caches=caches)
    for cache, messages, reply in zip(caches, starts, first):
        answer = [model.memory_id(c.name) for c in reply.tool_calls]
        assert cache.ids[: len(conversation_ids(model, messages)) + 1] == conversation_ids(model, messages) + answer[:1]
        assert cache.kv.get_seq_length() == len(cache.ids)  # the padding of the batch left out
    nexts = [
        [
            *messages,
            reply.message,
            *({"role": "tool", "tool_call_id": c.id, "content": "done"} for c in reply.tool_calls),
        ]
        for messages, reply in zip(starts, first)
    ]
    held = [len(cache.ids) for cache in caches]
    second = tokmem.chat_batch(model, nexts, config=CONFIG, caches=caches)
    assert [c.prefilled for c in caches] == [len(conversation_ids(model, m)) - n for m, n in zip(nexts, held)]
    assert second == tokmem.chat_batch(model, nexts, config=CONFIG)
    mixed = [ChatCache(), caches[1]]  # one conversation new, one held: the new one's cache columns are all padding
    assert tokmem.chat_batch(model, nexts, config=CONFIG, caches=mixed) == second and mixed[0].prefilled > 0


def test_a_bad_conversation_in_a_batch_is_refused_naming_it(model):
    with pytest.raises(DataError, match=r"conversations\[1\]: messages\[1\]: no 'tool' message answers"):
        tokmem.chat_batch(model, [CONVERSATION[:1], CONVERSATION[:2]])


def test_after_a_tool_result_with_no_memory_token_routed_a_trained_bank_answers_in_words(lively_backbone):
    model = tokmem.create(lively_backbone)
    examples = [
        Example(
            f"Weather in {city}, please ({k})?",
            (Step("city", json.dumps({"name": "city", "arguments": {"city": city}}), result=f"{20 + k} degrees"),),
        )
        for k, city in enumerate(["Oslo", "Rome"] * 4)
    ]
    report = tokmem.learn(model, examples, tokmem.TrainConfig(epochs=2, progress=False), schemas={"city": CITY})
    assert all(math.isfinite(loss) for loss in report.losses)  # the answer label after each result trained too
    conversation = [
        {"role": "user", "content": "Weather in Rome, please?"},
        {"role": "assistant", "content": None, "tool_calls": [call("a", "city", {"city": "Rome"})]},
        {"role": "tool", "tool_call_id": "a", "content": "21 degrees"},
    ]
    reply = tokmem.chat(model, conversation, config=DecodeConfig(max_new_tokens=8))
    assert not reply.tool_calls and reply.content  # the backbone's own reply, not silence and not another call
    follow_up = [*conversation, reply.message, {"role": "user", "content": "And in Oslo?"}]
    next_turn = tokmem.chat(model, follow_up, config=DecodeConfig(max_new_tokens=8))
    assert next_turn.tool_calls or next_turn.content


ALWAYS = DecodeConfig(threshold=0.0, max_new_tokens=16)  # every turn routes to a memory row while one is allowed


@pytest.fixture
def pinger(lively_backbone):
    return ping_bank(lively_backbone)


def test_a_turn_that_would_repeat_an_answered_call_is_decoded_again_without_that_tool(pinger):
    first = tokmem.chat(pinger, PINGED[:1], config=ALWAYS)
    assert {(c.name, c.arguments) for c in first.tool_calls} == {("ping", "{}")}  # it would call it again
    after = tokmem.chat(pinger, PINGED, config=ALWAYS)
    assert not after.tool_calls and after.content is not None
    assert after.message == tokmem.chat(pinger, PINGED, tool_choice="none", config=ALWAYS).message


def test_a_new_user_message_or_a_forced_tool_choice_may_call_the_same_tool_again(pinger):
    asked_again = [*PINGED, {"role": "assistant", "content": "pong"}, {"role": "user", "content": "Once more."}]
    assert {c.name for c in tokmem.chat(pinger, asked_again, config=ALWAYS).tool_calls} == {"ping"}
    assert {c.name for c in tokmem.chat(pinger, PINGED, tool_choice="required", config=ALWAYS).tool_calls} == {"ping"}


def test_asked_to_avoid_repeats_a_required_turn_calls_another_tool_than_the_one_just_answered(lively_backbone):
    model = tokmem.create(lively_backbone)
    no_parameters = {"type": "object", "properties": {}}
    model.bank.add(["ping", "pong"], lively_backbone.mean_embedding(), kinds=["tool", "tool"])
    model.bank.schemas[:] = [no_parameters, no_parameters]
    random_rows(model.bank, scale=0.7)
    one_call = replace(ALWAYS, max_steps=1)
    [first] = tokmem.chat_batch(model, [PINGED[:1]], tool_choice="required", config=one_call)
    name = first.tool_calls[0].name
    answered = [
        PINGED[0],
        {"role": "assistant", "content": None, "tool_calls": [call("a", name, {})]},
        {"role": "tool", "tool_call_id": "a", "content": "done"},
    ]
    called = {
        avoid: [
            c.name
            for c in tokmem.chat_batch(model, [answered], tool_choice="required", config=one_call, avoid_repeats=avoid)[
                0
            ].tool_calls
        ]
        for avoid in (None, True)
    }
    assert called[None] == [name]  # required may repeat the call just answered (the server's rule) ...
    assert called[True] and name not in called[True]  # ... unless asked not to: the other tool


def test_a_conversation_decoded_again_in_a_batch_gets_the_answer_it_gets_alone(pinger):
    conversations = [PINGED, PINGED[:1]]
    together = tokmem.chat_batch(pinger, conversations, config=ALWAYS)
    assert [r.message for r in together] == [tokmem.chat(pinger, c, config=ALWAYS).message for c in conversations]
    assert [bool(r.tool_calls) for r in together] == [False, True]


def test_of_several_calls_the_repeats_are_dropped_and_the_rest_renumbered_whatever_their_json_spacing():
    answered = answered_calls(CONVERSATION)  # city {"city": "Rome"} and count {"n": 3}
    reply = Reply(
        None, [ToolCall("call_5_0", "city", '{"city":"Rome"}'), ToolCall("call_5_1", "count", '{"n": 4}')], "tool_calls"
    )
    kept, repeated = without_repeats(reply, answered, 5)
    assert repeated == [] and [(c.id, c.name, c.arguments) for c in kept.tool_calls] == [
        ("call_5_0", "count", '{"n": 4}')
    ]
    only_repeats = Reply(None, [ToolCall("call_5_0", "count", '{ "n" : 3 }')], "tool_calls")
    assert without_repeats(only_repeats, answered, 5) == (only_repeats, ["count"])
    assert answered_calls(CONVERSATION, "required") == set()
