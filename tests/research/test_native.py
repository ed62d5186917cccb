"""Native tool calling, the baseline a user picks instead of TokMem: the tools in the chat template, calls read from
its ``<tool_call>`` blocks, results as its tool turns; and what answering costs every method per call.

The tiny-random backbone's ChatML template has no tool support, so these tests give a copy of its tokenizer a
Qwen2.5-style template that renders ``tools``, assistant ``tool_calls`` and ``role: "tool"`` turns."""

import copy
import json

import pytest

from tokmem.backbones import Backbone
from tokmem.data.procedures import Example, Step, call_json
from tokmem.data.tool_catalog import catalog, split_tools
from tokmem.decoding.decode import DecodeConfig
from tokmem.errors import TokMemError
from tokmem.eval import metrics
from tokmem.eval.evaluate import score_calls
from research.methods.native import NativeTools, read_tool_calls
from research.methods.tokmem import TokMem
from research.studies import compositional, compositional_report
from research.studies.compositional_config import make_config
from research.studies.harness import progress_bar
from tokmem.eval.tool_loop import conversation
from research.studies.tool_loop import loop_scores

QWEN_STYLE_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n\n<tools>"
    "{%- for tool in tools %}{{ '\\n' ~ (tool | tojson) }}{%- endfor %}\n</tools>\n\n"
    "For each function call, return a json object within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>{{ \'\\n\' }}{%- endif %}'
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant"
    "{%- for tool_call in message.tool_calls %}{%- set tool_call = tool_call.function %}{{ '\\n' }}<tool_call>\n"
    '{"name": "{{ tool_call.name }}", "arguments": {{ tool_call.arguments | tojson }}}\n</tool_call>'
    "{%- endfor %}<|im_end|>{{ '\\n' }}"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n"
    "</tool_response><|im_end|>{{ '\\n' }}"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>{{ '\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

TOOLS = {
    name: {"name": name, "description": f"{name} a place", "parameters": {"type": "object", "properties": {}}}
    for name in ("Find", "Rent", "Book")
}


@pytest.fixture(scope="module")
def qwen_style(backbone):
    tokenizer = copy.deepcopy(backbone.tokenizer)
    tokenizer.chat_template = QWEN_STYLE_TEMPLATE
    return Backbone("tiny-random-tools", backbone.model, tokenizer)


def chain(query="Rent a car at the Marriott.") -> Example:
    return Example(
        query,
        (
            Step("Find", call_json("Find", {"query": "Marriott"}), '{"lat":32.87}'),
            Step("Rent", call_json("Rent", {"lat": 32.87}), '{"cars":3}'),
        ),
    )


def prompt_text(method: NativeTools, query: str) -> str:
    return method.model.backbone.tokenizer.decode(method.prompt_ids([query])[0])


def tools_block(text: str) -> list[dict]:
    return [json.loads(line) for line in text.split("<tools>")[1].split("</tools>")[0].strip().splitlines()]


def test_native_shows_every_tools_schema_through_the_chat_template(qwen_style):
    text = prompt_text(NativeTools(qwen_style, TOOLS), "Rent a car.")
    assert tools_block(text) == [{"type": "function", "function": schema} for schema in TOOLS.values()]
    assert text.endswith("<|im_start|>user\nRent a car.<|im_end|>\n<|im_start|>assistant\n")


def test_native_retrieved_shows_only_the_top_k_tools_the_retriever_ranks_first(qwen_style):
    method = NativeTools(qwen_style, catalog(split_tools()[1]), k=2)
    shown = [tool["function"]["name"] for tool in tools_block(prompt_text(method, "Compute 12 factorial."))]
    assert len(shown) == 2 and shown[0] == "calculate_factorial"
    assert method.name == "native-retrieved"


def test_earlier_calls_are_the_templates_assistant_calls_and_results_its_tool_turns_cut_to_the_budget(qwen_style):
    example = chain()
    history = [(example.steps[0].response, "x" * 50)]
    ids = NativeTools(qwen_style, TOOLS).contexts([conversation(example, history)], result_tokens=8)[0]
    text = qwen_style.tokenizer.decode(ids)
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "Find", "arguments": {"query": "Marriott"}}\n</tool_call>' in text
    )
    assert "<tool_response>\nxxxxxxxx … [result cut: 8 of 50 tokens shown]\n</tool_response>" in text
    assert text.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize(
    "text, calls",
    [
        (
            '<tool_call>\n{"name": "Find", "arguments": {"query": "Marriott"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "Rent", "arguments": {"lat": 32.87}}\n</tool_call>',
            [call_json("Find", {"query": "Marriott"}), call_json("Rent", {"lat": 32.87})],
        ),
        # cut by the token limit, arguments that are no object, no JSON: each kept as a JSON string, a miss
        (
            '<tool_call>\n{"name": "Find", "arguments": {"query": "Marr',
            [json.dumps('{"name": "Find", "arguments": {"query": "Marr')],
        ),
        (
            '<tool_call>\n{"name": "Find", "arguments": "Marriott"}\n</tool_call>',
            [json.dumps('{"name": "Find", "arguments": "Marriott"}')],
        ),
        ("<tool_call>\nfind the Marriott\n</tool_call>", [json.dumps("find the Marriott")]),
        # no block: read as every prompted baseline's answer is, a bare call a call and prose a wrong one
        (
            '{"name": "Find", "arguments": {"query": "Marriott"}}',
            ['{"name": "Find", "arguments": {"query": "Marriott"}}'],
        ),
        ("I would find the Marriott.", ["I would find the Marriott."]),
        ("", []),
    ],
)
def test_tool_call_blocks_are_read_as_calls_and_a_malformed_block_is_a_call_that_matches_nothing(text, calls):
    assert read_tool_calls(text) == calls
    gold = chain()
    scores = score_calls([gold], [read_tool_calls(text)])
    right = sum(metrics.read_call(c) in [metrics.read_call(s.response) for s in gold.steps] for c in calls)
    assert scores["call_f1"]["avg"] == pytest.approx(100 * 2 * right / (len(calls) + 2))


def test_a_template_without_tool_support_is_refused_naming_the_backbone(backbone):
    with pytest.raises(TokMemError, match="backbone 'tiny-random' has no native tool calling"):
        NativeTools(backbone, TOOLS)


def test_in_the_tool_loop_native_reads_every_schema_per_call_and_tokmem_one_memory_token(qwen_style):
    examples = [chain(), chain("Rent a car at the Hilton.")]
    native = NativeTools(qwen_style, TOOLS, decode=DecodeConfig(max_new_tokens=6))
    tokmem = TokMem(qwen_style, decode=DecodeConfig(max_steps=2, max_new_tokens=6))
    tokmem.learn(examples)
    scores = {m.name: loop_scores(m, examples, 2, 256, progress_bar(False)) for m in (native, tokmem)}
    for result in scores.values():
        assert set(result["step"]) >= {"tool_f1", "arg_f1", "call_f1"} and "end_to_end" in result
        assert result["prompt_tokens_per_call"] > 0 and result["seconds_per_call"] > 0
    contexts = [
        native.contexts([conversation(e, [(s.response, s.result) for s in e.steps[:k]])])[0]
        for e in examples
        for k in range(len(e.steps))
    ]
    assert scores["native"]["prompt_tokens_per_call"] == pytest.approx(sum(map(len, contexts)) / 4, abs=0.05)
    assert scores["tokmem"]["prompt_tokens_per_call"] < scores["native"]["prompt_tokens_per_call"]


def test_every_method_of_the_main_study_reports_its_prompt_tokens_and_seconds_per_call(qwen_style, tmp_path):
    methods = ("icl", "rag", "lora", "tokmem-noadapt", "native", "native-retrieved")
    sizes = dict(tools=4, per_tool=4, train_multi=4, test_multi=4, max_calls=3, max_length=64, max_new_tokens=4)
    config = make_config(None, "main", backbone="tiny-random", methods=methods, rag_k=2, device="cpu", **sizes)
    result = compositional.run(config, qwen_style, progress=False)
    assert list(result["methods"]) == list(methods)
    for scores in result["methods"].values():
        assert scores["prompt_tokens_per_call"] > 0 and scores["seconds_per_call"] > 0
    cost = {name: s["prompt_tokens_per_call"] for name, s in result["methods"].items()}
    assert cost["native-retrieved"] < cost["native"]  # 2 of the 4 schemas
    table = compositional_report.markdown(result)
    assert "| Prompt tokens / call | s / call |" in table and "Native tool calling (top 2 retrieved)" in table


def test_only_the_main_study_runs_native_tool_calling():
    assert make_config(None, "main", methods=("native", "native-retrieved")).resolved().methods == (
        "native",
        "native-retrieved",
    )
    with pytest.raises(TokMemError, match="cannot run native"):
        make_config(None, "generalization", methods=("native",)).resolved()
