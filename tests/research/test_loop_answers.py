"""The loop study's answer analysis (research/scripts/loop_answers.py): where a gold value could be read from."""

from research.scripts import loop_answers

from tokmem.data.procedures import Example, Step, call_json


def test_a_value_is_counted_from_the_query_first_then_the_result_as_shown_then_the_part_the_cut_hides(backbone):
    tokenizer = backbone.tokenizer
    hidden = "x" * 40 + " zq-77"  # past a 20-token cut (the byte-level tokenizer: a token a byte)
    example = Example(
        "Find cars near Melbourne.",
        (
            Step("Search", call_json("Search", {"query": "Melbourne"}), result='{"id": "ab12"} ' + hidden),
            Step("Rent", call_json("Rent", {"id": "ab12", "code": "zq-77", "date": "2024-12-15"})),
        ),
    )
    assert loop_answers.value_origins(example, tokenizer, budget=20) == [
        {"query": "query"},
        {"id": "result as shown", "code": "past the cut", "date": "rewritten"},
    ]
    assert loop_answers.value_origins(example, tokenizer, budget=10_000)[1]["code"] == "result as shown"


def test_a_value_counts_as_right_only_when_the_answer_names_the_right_tool(backbone):
    example = Example("Rent car ab12.", (Step("Rent", call_json("Rent", {"id": "ab12"})),))
    gold = call_json("Rent", {"id": "ab12"})
    samples = [{"query": example.query, "gold": [gold], "step": [call_json("Search", {"id": "ab12"})]}]
    counted = loop_answers.summary(samples, {example.query: example}, set(), set(), backbone.tokenizer)
    assert counted["wrong tool"] == 1
    assert counted["values right, by origin"]["query"] == "0 of 1"
    samples[0]["step"] = [gold]
    counted = loop_answers.summary(samples, {example.query: example}, set(), set(), backbone.tokenizer)
    assert (counted["exact"], counted["values right, by origin"]["query"]) == (1, "1 of 1")


def test_the_keys_of_the_right_tool_left_out_are_counted_by_where_their_value_was_and_those_added_apart(backbone):
    gold = call_json("Hotel", {"city": "Oslo", "adults": 3})
    example = Example("A hotel in Oslo for 3 adults.", (Step("Hotel", gold),))
    samples = [{"query": example.query, "gold": [gold], "step": [call_json("Hotel", {"city": "Oslo", "stars": 5})]}]
    counted = loop_answers.summary(samples, {example.query: example}, set(), set(), backbone.tokenizer)
    assert counted["wrong key set"] == 1 and counted["keys of the right tool added"] == 1
    assert counted["keys of the right tool left out, by origin"]["query"] == 1
    samples[0]["step"] = [call_json("Find", {})]  # another tool: its keys are not counted
    counted = loop_answers.summary(samples, {example.query: example}, set(), set(), backbone.tokenizer)
    assert (
        counted["keys of the right tool added"] == 0
        and counted["keys of the right tool left out, by origin"]["query"] == 0
    )


def test_a_wrong_value_is_counted_as_recalled_when_a_training_call_of_that_tool_and_argument_held_it(backbone):
    example = Example("Rent car ab12.", (Step("Rent", call_json("Rent", {"id": "ab12"})),))
    trained = loop_answers.trained_values(
        [Example("Rent car zz99.", (Step("Rent", call_json("Rent", {"id": "zz99"})),))]
    )
    samples = [{"query": example.query, "gold": [call_json("Rent", {"id": "ab12"})], "step": [None]}]
    for answer, recalled in (("zz99", "1 of 1"), ("qq00", "0 of 1")):
        samples[0]["step"] = [call_json("Rent", {"id": answer})]
        counted = loop_answers.summary(samples, {example.query: example}, trained, set(), backbone.tokenizer)
        assert counted["wrong values recalled from training"] == recalled


def test_exact_steps_are_counted_apart_for_tools_whose_schema_lists_keys_out_of_the_calls_order(backbone):
    rent = {"type": "object", "properties": {"to": {"type": "string"}, "from": {"type": "string"}}}
    find = {"type": "object", "properties": {"q": {"type": "string"}, "limit": {"type": "integer"}}}
    calls = [Step("Rent", call_json("Rent", {"from": "a", "to": "b"})), Step("Find", call_json("Find", {"q": "x"}))]
    train = [Example("Rent a car from a to b.", tuple(calls))]
    tools = {"Rent": {"parameters": rent}, "Find": {"parameters": find}, "Free": {}}
    assert loop_answers.reordered_tools(tools, train) == {"Rent"}  # "limit", never given, reorders nothing
    example = train[0]
    samples = [{"query": example.query, "gold": [c.response for c in calls], "step": [c.response for c in calls]}]
    counted = loop_answers.summary(samples, {example.query: example}, set(), {"Rent"}, backbone.tokenizer)
    assert counted["exact steps, by the tool's schema order"] == {
        "schema in the calls' order": "1 of 1",
        "schema out of the calls' order": "1 of 1",
    }
    samples[0]["step"][0] = call_json("Rent", {"from": "b", "to": "a"})
    counted = loop_answers.summary(samples, {example.query: example}, set(), {"Rent"}, backbone.tokenizer)
    assert counted["exact steps, by the tool's schema order"]["schema out of the calls' order"] == "0 of 1"
    assert counted["outcomes, by the tool's schema order"]["schema out of the calls' order"]["wrong values"] == 1
    assert counted["wrong values of the wrong-values steps, by kind"]["another key's"] == 2  # from and to swapped
    assert counted["wrong-values steps, by how many values are wrong"] == {"1": 0, "2": 1, "3 or more": 0}
    assert counted["wrong-values steps whose wrong values are all of one kind"]["another key's"] == 1


def test_a_loop_ab_variant_is_read_as_the_preset_with_its_settings():
    base = {"preset": "cpu", "dataset": "complexfuncbench", "method": "tokmem-noadapt", "seed": 1}
    plain = loop_answers.variant_config(base, "tiny-random", {})
    assert (plain.methods, plain.seed, plain.train_multi, plain.backbone) == (
        ("tokmem-noadapt",),
        1,
        120,
        "tiny-random",
    )
    chains = loop_answers.variant_config(base, "tiny-random", {"methods": ["tokmem"], "adapt_data": ["chains"]})
    assert (chains.methods, chains.adapt_data) == (("tokmem",), ("chains",))
    assert plain.split == "test"  # a file from before the splits answered records of the test split
    now = {"preset": "cpu", "dataset": "complexfuncbench", "methods": ["tokmem"], "seed": 1, "split": "dev"}
    assert loop_answers.variant_config(now, "tiny-random", {}).split == "dev"
