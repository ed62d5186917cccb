"""The training sequence chat(query) m_i r_i m_j r_j … EOS, its labels, truncation and collation."""

import functools
from dataclasses import replace

import pytest
import torch

from tokmem import Example, Step
from tokmem.errors import DataError
from tokmem.training.sequences import (
    ANSWER,
    IGNORE,
    TruncationCount,
    chat_prefix,
    chat_turns,
    collate,
    encode,
    result_ids,
    result_turn,
)

CHAIN = Example("Reverse water, then capitalise it.", (Step("reverse", "retaw"), Step("upper", "RETAW")), id="chain")
MEMORY = {"reverse": 1000, "upper": 1001}


@pytest.fixture
def tokenizer(backbone):
    return backbone.tokenizer


def tokens(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_chat_prefix_ends_where_the_assistant_answer_starts(tokenizer):
    assert tokenizer.decode(chat_prefix(tokenizer, "hi")) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_chat_turns_split_the_chat_prefix_at_the_assistant_header(tokenizer):
    turn, header = chat_turns(tokenizer, "hi")
    assert tokenizer.decode(turn) == "<|im_start|>user\nhi<|im_end|>\n"
    assert tokenizer.decode(header) == "<|im_start|>assistant\n"
    assert turn + header == chat_prefix(tokenizer, "hi")


def test_without_a_chat_template_the_turn_is_the_query_line_and_the_header_is_empty(tokenizer, monkeypatch):
    monkeypatch.setattr(tokenizer, "chat_template", None)
    turn, header = chat_turns(tokenizer, "hi")
    assert (turn, header) == (tokens(tokenizer, "hi\n"), [])
    assert chat_prefix(tokenizer, "hi") == turn


def test_sequence_is_prefix_then_memory_token_before_each_segment_then_eos(tokenizer):
    encoded = encode(CHAIN, tokenizer, MEMORY.get, max_length=1024)
    prefix = chat_prefix(tokenizer, CHAIN.query)
    target = [1000, *tokens(tokenizer, "retaw"), 1001, *tokens(tokenizer, "RETAW"), tokenizer.eos_token_id]
    assert encoded.input_ids == prefix + target
    assert encoded.labels == [IGNORE] * len(prefix) + target


def test_without_memory_tokens_the_segments_are_one_per_line_as_the_response_reads(tokenizer):
    encoded = encode(CHAIN, tokenizer, None, max_length=1024)
    prefix = chat_prefix(tokenizer, CHAIN.query)
    assert encoded.input_ids == prefix + tokens(tokenizer, "retaw\nRETAW") + [tokenizer.eos_token_id]
    assert tokenizer.decode(encoded.input_ids[len(prefix) : -1]) == CHAIN.response


LONG_QUERY = Example("Reverse water. " * 20, (Step("reverse", "retaw"),), id="long query")
LONG_TARGET = Example("Reverse water.", (Step("reverse", "retaw " * 40),), id="long target")


def layout(tokenizer, example):
    """The example's query tokens and target tokens, uncut."""
    prefix = chat_prefix(tokenizer, example.query)
    return prefix, encode(example, tokenizer, MEMORY.get, max_length=4096).input_ids[len(prefix) :]


def test_a_long_query_is_cut_from_the_left_and_the_targets_kept_whole(tokenizer):
    prefix, target = layout(tokenizer, LONG_QUERY)
    max_length = 2 * len(target) + 4  # the targets take less than half: the query gets the rest
    count = TruncationCount()
    encoded = encode(LONG_QUERY, tokenizer, MEMORY.get, max_length=max_length, truncated=count)
    kept = max_length - len(target)
    assert len(prefix) > kept and encoded.input_ids == prefix[-kept:] + target
    assert encoded.labels == [IGNORE] * kept + target
    assert (count.sequences, count.queries, count.responses, count.examples) == (1, 1, 0, ["long query"])


def test_the_query_keeps_half_the_window_and_targets_too_long_lose_their_end(tokenizer):
    """A target learnt with no query before it teaches noise: the query keeps half of max_length, whatever the
    targets' length (before, one token stayed)."""
    example = replace(LONG_QUERY, steps=LONG_TARGET.steps)
    prefix, target = layout(tokenizer, example)
    count = TruncationCount()
    encoded = encode(example, tokenizer, MEMORY.get, max_length=40, truncated=count)
    assert len(prefix) > 20 and len(target) > 20
    assert encoded.input_ids == prefix[-20:] + target[:20]
    assert encoded.labels == [IGNORE] * 20 + target[:20]
    assert tokenizer.eos_token_id not in encoded.input_ids[20:]  # the targets lost their EOS
    assert (count.sequences, count.queries, count.responses) == (1, 1, 1)


def test_a_short_query_stays_whole_when_only_the_targets_are_cut(tokenizer):
    prefix, target = layout(tokenizer, LONG_TARGET)
    max_length = 2 * len(prefix) + 2
    count = TruncationCount()
    encoded = encode(LONG_TARGET, tokenizer, MEMORY.get, max_length=max_length, truncated=count)
    assert len(target) > max_length - len(prefix)
    assert encoded.input_ids == prefix + target[: max_length - len(prefix)]
    assert (count.sequences, count.queries, count.responses) == (1, 0, 1)


def test_a_sequence_that_fits_is_not_counted_as_truncated(tokenizer):
    count = TruncationCount()
    full = encode(CHAIN, tokenizer, MEMORY.get, max_length=1024, truncated=count)
    exact = encode(CHAIN, tokenizer, MEMORY.get, max_length=len(full.input_ids), truncated=count)
    assert exact == full
    assert not count and count.examples == []


def test_truncation_counts_accumulate_over_examples(tokenizer):
    count = TruncationCount()
    short = Example("q", (Step("reverse", "x"),))
    for example in (CHAIN, short, CHAIN):
        encode(example, tokenizer, MEMORY.get, max_length=30, truncated=count)
    assert (count.queries, count.responses, count.examples) == (2, 0, ["chain", "chain"])


def test_collate_right_pads_with_mask_zero_and_ignored_labels(tokenizer):
    short = encode(Example("q", (Step("reverse", "x"),)), tokenizer, MEMORY.get, max_length=1024)
    long = encode(CHAIN, tokenizer, MEMORY.get, max_length=1024)
    batch = collate([short, long], pad_id=tokenizer.pad_token_id)
    n, width = len(short.input_ids), len(long.input_ids)
    assert batch["input_ids"].shape == batch["labels"].shape == batch["attention_mask"].shape == (2, width)
    assert batch["input_ids"][0].tolist() == short.input_ids + [tokenizer.pad_token_id] * (width - n)
    assert batch["labels"][0].tolist() == short.labels + [IGNORE] * (width - n)
    assert batch["attention_mask"][0].tolist() == [1] * n + [0] * (width - n)
    assert batch["input_ids"][1].tolist() == long.input_ids
    assert batch["labels"][1].tolist() == long.labels
    assert torch.all(batch["attention_mask"][1] == 1)


TOOL_CHAIN = Example(
    "Weather in Oslo, then convert 3 km.",
    (
        Step("weather", '{"name": "weather", "arguments": {"city": "Oslo"}}'),
        Step("convert", '{"name":"convert","arguments":{"value":3,"unit":"km"}}'),
    ),
    id="tools",
)


def test_after_a_tools_memory_token_come_only_its_arguments_as_compact_json(tokenizer):
    memory = {"weather": 1000, "convert": 1001}
    encoded = encode(TOOL_CHAIN, tokenizer, memory.get, max_length=1024, tools={"weather", "convert"})
    prefix = chat_prefix(tokenizer, TOOL_CHAIN.query)
    target = [
        1000,
        *tokens(tokenizer, '{"city":"Oslo"}'),
        1001,
        *tokens(tokenizer, '{"value":3,"unit":"km"}'),
        tokenizer.eos_token_id,
    ]
    assert encoded.input_ids == prefix + target
    assert encoded.labels == [IGNORE] * len(prefix) + target


def test_a_tool_not_listed_keeps_its_whole_call_as_the_segment(tokenizer):
    memory = {"weather": 1000, "convert": 1001}
    encoded = encode(TOOL_CHAIN, tokenizer, memory.get, max_length=1024, tools={"convert"})
    weather = tokens(tokenizer, TOOL_CHAIN.steps[0].response)
    assert encoded.input_ids[len(chat_prefix(tokenizer, TOOL_CHAIN.query)) + 1 :][: len(weather)] == weather


def test_a_tool_whose_step_is_not_a_call_of_it_is_refused_naming_the_example(tokenizer):
    example = Example("Weather?", (Step("weather", "sunny"),), id="q7")
    with pytest.raises(
        DataError, match="example q7: 'weather' is a tool in the bank, but its step is not a call of it"
    ):
        encode(example, tokenizer, {"weather": 1000}.get, max_length=1024, tools={"weather"})


WEATHER_RESULT = '{"temp": 21}'
WITH_RESULTS = Example(
    "Weather in Oslo, then convert 3 km.",
    (
        Step("weather", '{"name":"weather","arguments":{"city":"Oslo"}}', result=WEATHER_RESULT),
        Step("convert", '{"name":"convert","arguments":{"value":3,"unit":"km"}}', result="5000 m"),
    ),
    id="results",
)


def result_turn_ids(tokenizer, result: str) -> list[int]:
    return tokens(tokenizer, f"\n<|im_start|>tool\n{result}<|im_end|>\n<|im_start|>assistant\n")


def test_a_result_follows_its_call_as_a_tool_turn_then_the_assistant_header_and_is_never_a_target(tokenizer):
    memory = {"weather": 1000, "convert": 1001}
    encoded = encode(WITH_RESULTS, tokenizer, memory.get, max_length=1024, tools={"weather", "convert"})
    eos = tokenizer.eos_token_id
    turn = functools.partial(result_turn_ids, tokenizer)
    call_1 = [1000, *tokens(tokenizer, '{"city":"Oslo"}'), eos]
    call_2 = [1001, *tokens(tokenizer, '{"value":3,"unit":"km"}'), eos]
    prefix = chat_prefix(tokenizer, WITH_RESULTS.query)
    assert encoded.input_ids == prefix + call_1 + turn(WEATHER_RESULT) + call_2 + turn("5000 m") + [eos]
    ignored = lambda ids: [IGNORE] * len(ids)  # noqa: E731
    assert encoded.labels == ignored(prefix) + call_1 + ignored(turn(WEATHER_RESULT)) + call_2 + ignored(
        turn("5000 m")
    ) + [ANSWER]


def test_after_the_last_result_the_assistant_answers_in_words_and_never_learns_to_stop_in_silence(tokenizer):
    memory = {"weather": 1000, "convert": 1001}
    encoded = encode(WITH_RESULTS, tokenizer, memory.get, max_length=1024, tools={"weather", "convert"})
    header_end = len(encoded.input_ids) - 1  # the last result's assistant header ends here: the answer starts
    assert tokenizer.decode(encoded.input_ids[:header_end]).endswith("5000 m<|im_end|>\n<|im_start|>assistant\n")
    assert encoded.labels[header_end:] == [ANSWER]  # a word, not a memory token, not EOS
    assert tokenizer.eos_token_id not in encoded.labels[header_end:]


def test_a_final_answer_after_the_last_result_is_trained_as_a_response_then_eos(tokenizer):
    memory = {"weather": 1000, "convert": 1001}
    answered = replace(WITH_RESULTS, answer="It is 21 degrees; 3 km is 5000 m.")
    encoded = encode(answered, tokenizer, memory.get, max_length=1024, tools={"weather", "convert"})
    answer = tokens(tokenizer, answered.answer) + [tokenizer.eos_token_id]
    assert encoded.input_ids[-len(answer) :] == answer
    assert encoded.labels[-len(answer) :] == answer
    unanswered = encode(WITH_RESULTS, tokenizer, memory.get, max_length=1024, tools={"weather", "convert"})
    assert encoded.input_ids[: -len(answer)] == unanswered.input_ids[:-1]


def test_the_fine_tuning_layout_without_memory_tokens_keeps_its_eos_after_the_last_result(tokenizer):
    encoded = encode(WITH_RESULTS, tokenizer, None, max_length=1024)
    assert encoded.labels[-1] == encoded.input_ids[-1] == tokenizer.eos_token_id


def test_result_ids_are_the_template_tool_turns_of_the_whole_conversation(tokenizer):
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "CALL"},
        {"role": "tool", "content": "r1"},
        {"role": "tool", "content": "r2"},
    ]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    after_call = rendered[rendered.index("CALL<|im_end|>") + len("CALL<|im_end|>") :]
    assert tokenizer.decode(result_ids(tokenizer, ["r1", "r2"])) == after_call


# Qwen2.5's tool turns, in short: consecutive tool messages share one user turn, each in <tool_response> tags
QWEN_STYLE = (
    "{% for m in messages %}{% if m.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ m.content }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def assert_results_laid_out_as_the_template_writes_them(tokenizer):
    """A training sequence's results and a conversation's consecutive results are the template's tool turns."""
    calls = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "CALL"}]
    results = [{"role": "tool", "content": "r1"}, {"role": "tool", "content": "r2"}]
    rendered = tokenizer.apply_chat_template(calls + results, tokenize=False, add_generation_prompt=True)
    assert tokenizer.decode(result_ids(tokenizer, ["r1", "r2"])) == rendered[rendered.index("CALL") + 4 :].removeprefix(
        tokenizer.eos_token
    )
    one = tokenizer.apply_chat_template(calls + results[:1], tokenize=False, add_generation_prompt=True)
    vocab = len(tokenizer)  # memory ids come after the vocabulary
    encoded = encode(WITH_RESULTS, tokenizer, {"weather": vocab, "convert": vocab + 1}.get, 1024, tools={"weather"})
    text = tokenizer.decode([t for t in encoded.input_ids if t < vocab])
    assert one[one.index("CALL") :].replace("CALL", '{"city":"Oslo"}').replace("r1", WEATHER_RESULT) in text


def test_a_template_that_groups_tool_results_in_one_user_turn_is_followed(tokenizer, monkeypatch):
    monkeypatch.setattr(tokenizer, "chat_template", QWEN_STYLE)
    result_turn.cache_clear()
    try:
        assert_results_laid_out_as_the_template_writes_them(tokenizer)
        assert "<tool_response>" in tokenizer.decode(result_ids(tokenizer, ["r"]))
    finally:
        result_turn.cache_clear()


@pytest.mark.slow
def test_results_follow_the_real_qwen_template_in_tool_response_turns(qwen_tokenizer):
    assert_results_laid_out_as_the_template_writes_them(qwen_tokenizer)
    assert qwen_tokenizer.decode(result_ids(qwen_tokenizer, ["r"])) == (
        "\n<|im_start|>user\n<tool_response>\nr\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_long_result_is_cut_to_its_budget_and_says_so(tokenizer):
    ids = result_ids(tokenizer, ["x" * 50], budget=10)
    assert "x" * 10 + " … [result cut: 10 of 50 tokens shown]<|im_end|>" in tokenizer.decode(ids)
    assert "x" * 11 not in tokenizer.decode(ids)


def test_a_template_without_a_tool_role_gets_the_result_as_a_user_turn(tokenizer, monkeypatch):
    no_tool_role = (
        "{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tool role') }}{% endif %}"
        "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    monkeypatch.setattr(tokenizer, "chat_template", no_tool_role)
    result_turn.cache_clear()
    try:
        text = tokenizer.decode(result_ids(tokenizer, ["r"]))
    finally:
        result_turn.cache_clear()
    assert text == "\n<|im_start|>user\nTool result:\nr<|im_end|>\n<|im_start|>assistant\n"


def test_arguments_follow_the_schema_key_order_where_the_schema_is_known(tokenizer):
    schema = {"type": "object", "properties": {"unit": {"type": "string"}, "value": {"type": "number"}}}
    encoded = encode(
        TOOL_CHAIN,
        tokenizer,
        {"weather": 1000, "convert": 1001}.get,
        max_length=1024,
        tools={"weather": None, "convert": schema},
    )
    assert tokenizer.decode([t for t in encoded.input_ids if t < 1000]).endswith('{"unit":"km","value":3}<|im_end|>')
