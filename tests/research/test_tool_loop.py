"""The tool loop study's parts: references resolved to recorded values, the layout the methods answer, the offline
executor, and the per-step and end-to-end evaluations on the tiny model."""

import json

import pytest

from tokmem.data.nestful import import_nestful, resolve_references
from tokmem.data.procedures import Example, Step, call_json
from tokmem.decoding.decode import DecodeConfig
from research.methods.call_grammar import call_schema, compile_calls
from research.methods.lora import LoRA
from research.methods.tokmem import TokMem
from tokmem.training.sequences import encode
from research.studies.harness import progress_bar
from tokmem.eval.tool_loop import NO_RECORDED_RESPONSE, ReplayExecutor, json_call
from research.studies.tool_loop import loop_scores, plain_context, step_predictions

RESPONSES = {
    "var1": [{"city": "San Diego", "coordinates": {"latitude": 32.87, "longitude": -117.21}}],
    "var2": {"hotels": [{"id": 7}, {"id": 9}]},
}


def test_a_reference_is_resolved_to_the_value_it_names_in_the_recorded_response():
    arguments = {
        "lat": "$var1.coordinates.latitude$",  # a path into a one-item list reads its first item
        "second": "$var2.hotels.1.id$",  # an index step picks that item
        "nested": {"ids": ["$var2.hotels.0.id$"]},
        "plain": "2024-10-14",
    }
    assert resolve_references(arguments, RESPONSES) == {
        "lat": 32.87,
        "second": 9,
        "nested": {"ids": [7]},
        "plain": "2024-10-14",
    }


@pytest.mark.parametrize("reference", ["$var3.city$", "$var1.country$", "$var2.hotels.5.id$", "near $var1.city$"])
def test_a_reference_that_names_nothing_stays_as_it_is(reference):
    assert resolve_references({"a": reference}, RESPONSES) == {"a": reference}


def test_importing_with_results_resolves_references_and_without_keeps_them(tmp_path):
    record = {
        "input": "Rent a car at the Marriott.",
        "output": [
            {"name": "Find", "arguments": {"query": "Marriott"}, "label": "var1", "response": RESPONSES["var1"]},
            {"name": "Rent", "arguments": {"lat": "$var1.coordinates.latitude$"}, "label": "var2", "response": {}},
        ],
        "tools": [
            {"name": "Find", "description": "d", "parameters": {"type": "object", "properties": {}}},
            {"name": "Rent", "description": "d", "parameters": {"type": "object", "properties": {}}},
        ],
    }
    path = tmp_path / "mine.json"
    path.write_text(json.dumps([record]))
    resolved = import_nestful(path).examples[0].steps[1]
    kept = import_nestful(path, results=False).examples[0].steps[1]
    assert json.loads(resolved.response)["arguments"] == {"lat": 32.87}
    assert json.loads(kept.response)["arguments"] == {"lat": "$var1.coordinates.latitude$"}


def chain(query="Rent a car.") -> Example:
    return Example(
        query,
        (
            Step("Find", call_json("Find", {"query": "Marriott"}), '{"lat":32.87}'),
            Step("Rent", call_json("Rent", {"lat": 32.87}), '{"cars":3}'),
        ),
    )


def test_the_plain_context_of_the_whole_gold_conversation_is_the_fine_tuning_sequence(backbone):
    """Fine-tuning trains on exactly the layout it answers: the sequence is the context of every call, plus EOS."""
    example, tokenizer = chain(), backbone.tokenizer
    history = [(s.response, s.result) for s in example.steps]
    sequence = encode(example, tokenizer, None, max_length=4096).input_ids
    assert plain_context(tokenizer, example.query, history, 256) + [tokenizer.eos_token_id] == sequence
    first = plain_context(tokenizer, example.query, history[:1], 256)
    assert sequence[: len(first)] == first


def test_the_replay_executor_answers_each_gold_call_once_with_its_recorded_response():
    executor = ReplayExecutor(chain())
    rent = '{"arguments": {"lat": 32.87}, "name": "Rent"}'  # the same call, keys in another order
    assert executor(rent) == '{"cars":3}'
    assert executor(rent) == NO_RECORDED_RESPONSE  # answered once
    assert executor(call_json("Find", {"query": "Hilton"})) == NO_RECORDED_RESPONSE
    assert executor(call_json("Find", {"query": "Marriott"})) == '{"lat":32.87}'


def test_fine_tuning_answers_each_step_with_one_call_at_most(backbone):
    examples = [chain(), Example("One call.", chain().steps[:1])]
    lora = LoRA(backbone, decode=DecodeConfig(max_new_tokens=6))
    lora.learn(examples)
    predicted, routes, _ = step_predictions(lora, examples, 256, progress_bar(False))
    assert [len(p) for p in predicted] == [2, 1]  # one answer per gold call, aligned with it
    assert all(call is None or isinstance(call, str) for p in predicted for call in p)  # None: no call made
    assert routes == [[None, None], [None]]  # no memory tokens, aligned with the steps


def test_the_loop_scores_each_step_by_position_the_pooled_f1_beside_and_keep_every_records_answers(backbone):
    examples = [chain(), *(chain(f"Rent car number {k}.") for k in range(2, 5))]
    method = TokMem(backbone, decode=DecodeConfig(max_steps=2, max_new_tokens=6))
    method.learn(examples)
    scores = loop_scores(method, examples, max_calls=2, result_tokens=256, bar=progress_bar(False))
    counts = {"exact_steps", "steps"}
    assert set(scores["step"]) == {"tool_f1", "arg_f1", "call_f1", "routing_f1"} | counts  # memory tokens' too
    assert set(scores["end_to_end"]) == {"tool_f1", "arg_f1", "call_f1"} | counts
    for part in ("step", "end_to_end"):
        assert all(set(scores[part][m]) == {"2", "all"} for m in scores[part])
        assert scores[part]["steps"]["all"] == 8 and 0 <= scores[part]["exact_steps"]["all"] <= 8
        assert set(scores[f"{part}_pooled"]["call_f1"]) == {"2", "avg"}
    assert sum(scores["outcomes"]["steps"].values()) == 8
    assert [sample["gold"] for sample in scores["samples"]] == [[s.response for s in e.steps] for e in examples]
    assert [sample["results"] for sample in scores["samples"]] == [[s.result for s in e.steps] for e in examples]
    assert all(len(sample["routes"]) == len(sample["gold"]) for sample in scores["samples"])


def test_tokmem_per_step_calls_a_tool_of_its_bank_at_every_step(backbone):
    examples = [chain(), Example("One call.", chain().steps[:1])]
    method = TokMem(backbone, decode=DecodeConfig(max_steps=2, max_new_tokens=6))
    method.learn(examples)
    predicted, routes, _ = step_predictions(method, examples, 256, progress_bar(False))
    assert [len(p) for p in predicted] == [2, 1]  # a call is due at every step: it is required
    assert all(call.startswith(('{"name":"Find"', '{"name":"Rent"')) for p in predicted for call in p)
    assert [len(r) for r in routes] == [2, 1] and {r for rs in routes for r in rs} <= {"Find", "Rent"}
    whole = [(call, r) for p, rs in zip(predicted, routes) for call, r in zip(p, rs) if json_call(call)]
    assert all(json.loads(call)["name"] == r for call, r in whole)  # a whole call names its memory token's tool


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"name": "Rent", "arguments": {"lat": 32.87}}', ("Rent", '{"lat":32.87}')),
        ('{"name":"Rent","arguments":{"lat":', None),  # cut mid-call: nothing can run it, the loop ends
        ("{'name': 'Rent', 'arguments': {}}", None),
        ('{"name": "Rent", "arguments": "lat"}', None),
    ],
)
def test_only_a_json_call_goes_on_to_the_executor(text, expected):
    assert json_call(text) == expected


def answer_with(wrong_at: int):
    """An answerer that makes each step's gold call, but calls the record's first tool again at step ``wrong_at``."""

    def answer(examples, histories, caches, choice):
        calls = []
        for example, history in zip(examples, histories):
            step = example.steps[0 if len(history) == wrong_at else len(history)]
            calls.append((step.response, json.loads(step.response)["name"]))
        return calls, 0

    return answer


def test_scores_per_step_only_count_each_answer_against_its_own_steps_gold_call_with_the_outcomes():
    from helpers import city_count_chain

    from tokmem.eval import tool_loop

    chain = city_count_chain()
    score = lambda answer: tool_loop.loop_scores(answer, [chain], 3, progress_bar(False), "x", True, end_to_end=False)  # noqa: E731
    right = score(answer_with(-1))
    assert right["step"]["exact_steps"]["all"] == 2
    assert right["outcomes"]["steps"]["exact"] == 2
    assert "end_to_end" not in right and "end_to_end" not in right["samples"][0]
    repeated = score(answer_with(1))
    assert repeated["step"]["exact_steps"]["all"] == 1
    assert repeated["samples"][0]["step"] == [chain.steps[0].response] * 2
    assert repeated["outcomes"]["steps"]["exact"] == 1 and sum(repeated["outcomes"]["steps"].values()) == 2


SCHEMAS = {
    "Find": {"type": "object", "properties": {"query": {"type": "string"}, "near": {"type": "string"}}},
    "Rent": {"type": "object", "properties": {"lat": {"type": "number"}, "days": {"type": "integer"}}},
}


def test_the_call_schema_admits_each_tool_with_the_key_sets_its_training_calls_wrote():
    examples = [chain(), Example("Rent for two days.", (Step("Rent", call_json("Rent", {"lat": 1.5, "days": 2})),))]
    schema = call_schema(SCHEMAS, examples)
    alternatives = [(a["properties"]["name"]["const"], a["properties"]["arguments"]) for a in schema["anyOf"]]
    assert [name for name, _ in alternatives] == ["Find", "Rent", "Rent"]  # Rent's calls wrote two key sets
    assert [sorted(arguments["properties"]) for _, arguments in alternatives] == [["query"], ["lat"], ["days", "lat"]]
    assert all(arguments["additionalProperties"] is False for _, arguments in alternatives)


def test_schema_bound_fine_tuning_writes_a_call_of_a_known_tool_where_one_is_due(backbone):
    examples = [chain(), Example("One call.", chain().steps[:1])]
    lora = LoRA(backbone, decode=DecodeConfig(max_new_tokens=64))
    lora.learn(examples)  # one round on a tiny random model: its free answers are rarely calls
    lora.call_grammar = compile_calls(backbone, SCHEMAS, examples)
    contexts = [plain_context(backbone.tokenizer, e.query, [], 256) for e in examples]
    for text in lora.continue_contexts(contexts, call_due=True):
        call = json.loads(text)  # a whole call within 64 tokens: the grammar bounds strings learned from training
        assert call["name"] in SCHEMAS and set(call) == {"name", "arguments"}
        assert set(call["arguments"]) == {"Find": {"query"}, "Rent": {"lat"}}[call["name"]]


def test_a_run_answered_per_step_only_reports_the_per_step_table_alone(backbone):
    from research.studies.compositional_report import loop_markdown

    examples = [chain(), Example("One call.", chain().steps[:1])]
    lora = LoRA(backbone, decode=DecodeConfig(max_new_tokens=6))
    scores = loop_scores(lora, examples, 2, 256, progress_bar(False), end_to_end=False)
    assert "step" in scores and "end_to_end" not in scores
    table = loop_markdown([{"label": "Fine-tuning", "trainable_params": 10, "updates": 0, **scores}])
    assert "## Per step" in table and "## End to end" not in table and "| Fine-tuning |" in table
