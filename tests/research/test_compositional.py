"""The compositional tool-calling studies on the tiny-random backbone: every method through each study,
the result shapes, the scoring by number of calls, the prompting baselines and the forgetting records."""

import argparse
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tokmem import Example, Step
from tokmem.eval.evaluate import score_calls as score
from research.methods.method import Answer, memory_routes, predicted_calls
from tokmem.decoding.decode import DecodeConfig, Segment
from tokmem.training.lora import LoRASettings
from tokmem.training.train import TrainConfig
from research.methods.tokmem import UnfrozenTokMem
from research.methods.method import first_block
from research.methods.tools import ICL, ToolRAG, compact_schema, tool_prompt
from research.cli import main
from tokmem.data.procedures import call_json
from tokmem.data.tool_catalog import catalog, split_tools
from tokmem.errors import TokMemError
from research import cli
from research.studies import atomic_config, compositional, compositional_report, tool_setup
from research.studies.compositional import METRICS, run_all
from research.studies.compositional_config import STUDIES, make_config
from research.studies.compositional_report import forgetting_panels
from research.studies.tool_setup import TOKMEM_LABELS

TINY = dict(
    backbone="tiny-random",
    tools=4,
    adapt_tools=2,
    per_tool=4,
    train_multi=4,
    test_multi=4,
    max_calls=3,
    adapt_per_tool=2,
    adapt_multi=2,
    max_length=64,
    max_new_tokens=4,
    eval_batch_size=8,
    train_max_calls=(1, 2),
    rounds=2,
    rag_k=2,
    device="cpu",
)


def run_study(study, backbone, tmp_path_factory):
    result = compositional.run(make_config(None, study, **TINY), backbone, progress=False)
    paths = compositional_report.write_outputs(result, tmp_path_factory.mktemp(study) / f"{study}.json")
    return result, paths


@pytest.fixture(scope="module")
def backbone_state(backbone):
    return {k: v.clone() for k, v in backbone.model.state_dict().items()}


@pytest.fixture(scope="module")
def main_study(backbone, backbone_state, tmp_path_factory):
    return run_study("main", backbone, tmp_path_factory)


@pytest.fixture(scope="module")
def generalization(backbone, backbone_state, tmp_path_factory):
    return run_study("generalization", backbone, tmp_path_factory)


@pytest.fixture(scope="module")
def forgetting(backbone, backbone_state, tmp_path_factory):
    return run_study("forgetting", backbone, tmp_path_factory)


def lora_params(backbone, rank=8):
    return sum(
        rank * (m.in_features + m.out_features)
        for n, m in backbone.model.named_modules()
        if n.endswith(("q_proj", "v_proj"))
    )


def call(name, **arguments):
    return call_json(name, arguments)


def example(*calls):
    return Example("q", tuple(Step(json.loads(c)["name"], c) for c in calls))


def assert_scores(scores, calls=("2", "3")):
    for metric in ("tool_f1", "arg_f1", "call_f1"):
        assert list(scores[metric]) == [*calls, "avg"]
        assert all(0.0 <= value <= 100.0 for value in scores[metric].values())
        assert scores[metric]["avg"] == pytest.approx(sum(scores[metric][c] for c in calls) / len(calls))


# ---- scoring ---------------------------------------------------------------------------------------------
def texts(*calls):
    return list(calls)


def test_scores_are_bucketed_by_the_number_of_gold_calls_and_averaged_over_the_buckets():
    a, b, c = call("f", x=1), call("g", y="s"), call("h", z=[1, 2])
    examples = [example(a, b), example(a, c), example(a, b, c)]
    predictions = [
        texts(b, a),  # order does not matter: both right
        texts(a, call("h", z=[9])),  # right tools, one wrong argument
        texts(c),  # one of three calls: F1 = 2·1 / (1 + 3)
    ]
    scores = score(examples, predictions)
    assert scores["tool_f1"] == {"2": 100.0, "3": 50.0, "avg": 75.0}  # the mean over buckets, not over queries (83.3)
    assert scores["arg_f1"] == {"2": pytest.approx(75.0), "3": 50.0, "avg": pytest.approx(62.5)}
    assert scores["call_f1"] == scores["arg_f1"]  # every predicted name is right here


def test_an_unparseable_predicted_call_matches_nothing_and_never_crashes():
    a, b = call("f", x=1), call("g", y=2)
    scores = score([example(a, b)] * 3, [texts("{", a), texts("", "f(x=1)"), []])
    # "{" is predicted but wrong: argument F1 2·1 / (2 + 2); it names no tool: tool F1 2·1 / (1 + 2).
    # The other two queries score 0.
    assert scores["arg_f1"]["2"] == pytest.approx(50.0 / 3)
    assert scores["tool_f1"]["2"] == pytest.approx(200.0 / 9)


@pytest.mark.parametrize("routes", [None, [["f", "g"]]], ids=["baseline", "tokmem"])
def test_a_calls_tool_is_the_name_its_text_gives_for_every_method(routes):
    """One rule: a call whose text does not parse names no tool, whether or not a memory token chose one."""
    a, b = call("f", x=1), call("g", y=2)
    scores = score([example(a, b)], [['{"name":"f","arguments":{"x": 1', b]], routes)
    assert scores["tool_f1"]["2"] == pytest.approx(100 * 2 / 3)  # g right; the broken f call names no tool
    assert scores["arg_f1"]["2"] == scores["call_f1"]["2"] == 50.0
    assert ("routing_f1" in scores) == (routes is not None)


def test_tokmems_memory_token_routing_is_scored_apart_as_routing_f1():
    a, b = call("f", x=1), call("g", y=2)
    scores = score([example(a, b)], [['{"name":"f","arguments":{"x": 1', b]], [["f", "h"]])
    assert scores["routing_f1"] == {"2": 50.0, "avg": 50.0}  # f chosen right, h wrong, whatever the texts say


def test_score_refuses_a_prediction_list_of_another_length():
    with pytest.raises(ValueError, match="2 predictions for 1 queries"):
        score([example(call("f", x=1))], [[], []])


def test_a_tokmem_segment_is_one_call_and_other_answers_are_split_into_calls():
    segments = [Segment("f", '{"a"\n: 1}'), Segment("g", "")]
    assert predicted_calls(Answer("ignored", segments=segments)) == ['{"a"\n: 1}', ""]
    assert memory_routes(Answer("ignored", segments=segments)) == ["f", "g"]
    assert memory_routes(Answer('{"name": "f"}')) is None
    assert predicted_calls(Answer(' {"name": "f"} \n\n{"name": "g"}\n')) == texts('{"name": "f"}', '{"name": "g"}')


def test_calls_run_together_on_one_line_are_split_and_stray_text_stays_one_wrong_call():
    answer = Answer('{"name": "f", "arguments": {}}{"name": "g", "arguments": {"x": 1}} sure!\n{"name": "h"')
    assert predicted_calls(answer) == texts(
        '{"name": "f", "arguments": {}}', '{"name": "g", "arguments": {"x": 1}}', "sure!", '{"name": "h"'
    )
    gold = example(call("f"), call("g", x=1))
    # f and g are right, "sure!" and the cut-off h are wrong: argument F1 2·2 / (4 + 2)
    assert score([gold], [predicted_calls(answer)])["arg_f1"]["2"] == pytest.approx(100 * 4 / 6)


def test_a_call_in_a_markdown_code_fence_is_read_as_the_call_and_the_fence_as_nothing():
    answer = Answer('```json\n{"name": "f", "arguments": {}}\n```\n``` wrong')
    assert predicted_calls(answer) == texts('{"name": "f", "arguments": {}}', "``` wrong")


# ---- the prompting baselines ---------------------------------------------------------------------------------
def test_icl_shows_every_tool_and_the_first_two_compositional_demonstrations(backbone):
    tools = catalog(split_tools()[1][:3])
    single, first, second, third = (
        example(call("a", x=9)),
        example(call("a", x=1), call("b", x=2)),
        example(call("b", x=3), call("c", x=4)),
        example(call("a", x=5), call("c", x=6)),
    )
    icl = ICL(backbone, tools)
    icl.learn([single, first])
    icl.learn([second, third])
    assert icl.demonstrations == [first, second]
    prompt = tool_prompt(icl.schemas, icl.demonstrations, "Compute 5 factorial.")
    assert all(json.dumps(s, separators=(",", ":")) in prompt for s in tools.values())
    assert (
        prompt.endswith("Request: Compute 5 factorial.\nCalls:")
        and first.response in prompt
        and single.response not in prompt
    )


def test_icl_shows_compact_schemas_when_the_full_ones_do_not_fit_the_context_window(backbone):
    tools = catalog(split_tools()[1])  # 25 full schemas: more characters (the tiny model's tokens) than its 2,048
    icl = ICL(backbone, tools)
    assert icl.label == "ICL (compact schemas)" and [s["name"] for s in icl.schemas] == list(tools)
    median = next(s for s in icl.schemas if s["name"] == "calculate_median")
    assert median == {
        "name": "calculate_median",
        "description": tools["calculate_median"]["description"],
        "parameters": {"numbers": "array"},
    }
    assert ICL(backbone, catalog(split_tools()[1][:2])).label == "ICL"


def test_a_compact_schema_lists_required_parameters_first_and_marks_optional_ones():
    schema = {
        "name": "f",
        "description": "d",
        "parameters": {
            "type": "object",
            "required": ["b"],
            "properties": {"a": {"type": "integer", "description": "long words"}, "b": {"type": "string"}, "c": {}},
        },
    }
    assert compact_schema(schema) == {
        "name": "f",
        "description": "d",
        "parameters": {"b": "string", "a?": "integer", "c?": "any"},
    }


def test_rag_retrieves_the_tools_whose_descriptions_match_the_query(backbone):
    rag = ToolRAG(backbone, catalog(split_tools()[1]), k=2)
    retrieved = rag.retrieve_tools(["Compute 12 factorial.", "What is the median of [3, 1, 2]?"])
    assert [len(row) for row in retrieved] == [2, 2]
    assert retrieved[0][0]["name"] == "calculate_factorial" and retrieved[1][0]["name"] == "calculate_median"


def test_a_prompted_answer_ends_at_its_first_blank_line():
    assert (
        first_block('\n{"name": "f"}\n{"name": "g"}\n\nRequest: more\nCalls:\n{"name": "h"}')
        == '{"name": "f"}\n{"name": "g"}'
    )


# ---- the studies ---------------------------------------------------------------------------------------------
def test_main_study_reports_both_f1s_by_calls_and_the_trainable_params_of_every_method(main_study, backbone):
    result, _ = main_study
    assert set(result) >= {"methods", "config", "machine"} and result["machine"]["torch"] == torch.__version__
    assert list(result["methods"]) == list(STUDIES["main"][0])
    for scores in result["methods"].values():
        assert_scores(scores)
    params = {name: scores["trainable_params"] for name, scores in result["methods"].items()}
    rows = TINY["tools"] * backbone.hidden_size
    assert params == {
        "icl": 0,
        "rag": 0,
        "lora": lora_params(backbone),
        "tokmem-noadapt": rows,
        "tokmem": rows,
        "tokmem-better": rows,
    }
    assert result["data"]["test"] == sum(result["data"]["test_by_calls"].values()) > 0
    assert result["adaptation"]["tools"] == split_tools()[0][:2]
    sources = result["adaptation"]["value_sources"]  # the built-in samples carry no results: nothing read from one
    assert sources["query"] > 0 and sources["last result"] == sources["older result"] == 0


def test_recipe_study_trains_tokmem_as_configured_and_with_each_option_switched_alone(backbone, tmp_path_factory):
    config = make_config(None, "recipe", **TINY, init="orthogonal", tool_segments="arguments")
    result = compositional.run(config, backbone, progress=False)
    changes = [point["change"] for point in result["variants"].values()]
    assert changes == [{}, {"init": "mean"}, {"schedule": "linear"}, {"tool_segments": "call"}]
    for point in result["variants"].values():
        assert_scores(point["methods"]["tokmem"])
    adapted_anew = [label for label, point in result["variants"].items() if "adaptation" in point]
    assert adapted_anew == ["tool_segments: call (not arguments)"]  # the adaptation phase teaches the segments' layout
    assert result["variants"][adapted_anew[0]]["adaptation"]["directory"] != result["adaptation"]["directory"]
    _, markdown, plot = compositional_report.write_outputs(result, tmp_path_factory.mktemp("recipe") / "recipe.json")
    assert "| init: mean (not orthogonal) | TokMem (w/ adapt) |" in markdown.read_text() and plot.stat().st_size > 0


def test_every_trained_method_trains_the_same_epochs(backbone):
    config = make_config(None, "main", **TINY, epochs=3)
    backbones = {"base": backbone, "adapted": backbone}
    trained = [
        tool_setup.build_method(name, config, backbones, {})
        for name in ("lora", "tokmem-noadapt", "tokmem", "tokmem-better")
    ]
    assert [m.epochs for m in trained] == [3, 3, 3, 3] and trained[1].train_config.epochs == 3


def test_the_better_recipe_row_is_tokmem_with_mean_rows_and_a_constant_learning_rate(backbone):
    config = make_config(None, "main", **TINY, init="orthogonal", schedule="linear")
    method = tool_setup.build_method("tokmem-better", config, {"base": backbone, "adapted": backbone}, {})
    assert (method.train_config.init, method.train_config.schedule) == ("mean", "constant")
    assert method.label == TOKMEM_LABELS["tokmem-better"] and "tokmem-better" in STUDIES["main"][0]


def test_main_study_writes_table_3_and_a_plot(main_study):
    result, (json_path, markdown, plot) = main_study
    assert json.loads(json_path.read_text())["methods"].keys() == result["methods"].keys()
    table = markdown.read_text()
    assert (
        "| Method | #Params | Updates | Routing F1 Avg. | Prompt tokens / call | s / call | Tool F1 2 calls | Tool F1 3 calls "
        "| Tool F1 Avg. | Argument F1 2 calls" in table
    )
    assert all(f"| {s['label']} |" in table for s in result["methods"].values())
    assert plot.stat().st_size > 0


def test_generalization_trains_every_method_under_each_cap_and_tests_on_the_same_queries(generalization):
    result, (_, markdown, _) = generalization
    points = result["train_max_calls"]
    train = result["data"]["train"]
    assert list(points) == list(train) == ["1", "2"] and train["1"] < train["2"]
    for point in points.values():
        assert list(point["methods"]) == ["lora", "tokmem"]
        for scores in point["methods"].values():
            assert_scores(scores)
    queries = {n: [s["query"] for s in p["methods"]["lora"]["samples"]] for n, p in points.items()}
    assert queries["1"] == queries["2"]
    assert "≤ 1 calls" in markdown.read_text()


def test_forgetting_scores_every_seen_group_after_each_round(forgetting):
    result, (_, markdown, _) = forgetting
    assert [len(tools) for tools in result["groups"]] == [2, 2]
    assert list(result["methods"]) == list(STUDIES["forgetting"][0])
    for entry in result["methods"].values():
        assert [p["round"] for p in entry["rounds"]] == [1, 2]
        for point in entry["rounds"]:
            assert list(point["groups"]) == [str(g) for g in range(1, point["round"] + 1)]
            for scores in point["groups"].values():
                assert 0.0 <= scores["arg_f1"]["avg"] <= 100.0 and 0.0 <= scores["tool_f1"]["avg"] <= 100.0
    assert "L2 norm of each round's new memory rows" in markdown.read_text()


def test_forgetting_records_the_norms_of_each_rounds_new_rows_and_renormalises_them(forgetting):
    methods = forgetting[0]["methods"]
    assert all(p["new_rows"] is None for p in methods["replay"]["rounds"])
    for name in ("tokmem", "tokmem-roundnorm", "tokmem-norenorm", "tokmem-unfrozen"):
        for point in methods[name]["rounds"]:
            norms = point["new_rows"]["norms"]
            assert len(norms) == 2 and point["new_rows"]["mean"] == pytest.approx(sum(norms) / 2)
    renormed, raw = methods["tokmem"]["rounds"], methods["tokmem-norenorm"]["rounds"]
    assert renormed[1]["new_rows"]["mean"] == pytest.approx(renormed[0]["new_rows"]["mean"], rel=1e-5)
    assert raw[1]["new_rows"]["mean"] != pytest.approx(raw[0]["new_rows"]["mean"], rel=1e-5)


def test_the_round_renormalised_variant_renormalises_after_the_round_only_whatever_the_config(backbone):
    config = make_config(None, "forgetting", **TINY, renorm_every_step=True)
    built = {
        name: tool_setup.build_method(name, config, {"base": backbone, "adapted": backbone}, {}).train_config
        for name in ("tokmem", "tokmem-roundnorm", "tokmem-norenorm")
    }
    assert built["tokmem"].renormalize and built["tokmem"].renorm_every_step
    assert built["tokmem-roundnorm"].renormalize and not built["tokmem-roundnorm"].renorm_every_step
    assert not built["tokmem-norenorm"].renormalize


def test_forgetting_runs_tokmem_on_the_better_recipe_renormalised_as_tokmem(backbone):
    reference = dict(init="orthogonal", schedule="linear")  # the cpu preset's recipe
    config = make_config(None, "forgetting", **TINY, **reference, methods=("replay", "tokmem-better")).resolved()
    built = tool_setup.build_method("tokmem-better", config, {"base": backbone, "adapted": backbone}, {}).train_config
    assert (built.init, built.schedule) == ("mean", "constant") != (config.init, config.schedule)
    assert built.renormalize and built.renorm_every_step == config.renorm_every_step


def test_forgetting_keeps_each_groups_first_answer_per_round_and_shows_group_1s_in_the_markdown(forgetting):
    result, (_, markdown, _) = forgetting
    first_query = result["methods"]["tokmem"]["rounds"][0]["samples"]["1"][0]["query"]
    for entry in result["methods"].values():
        for point in entry["rounds"]:
            assert list(point["samples"]) == list(point["groups"])
            assert [len(answers) for answers in point["samples"].values()] == [1] * point["round"]
            assert point["samples"]["1"][0]["query"] == first_query
    text = markdown.read_text()
    assert f"Query: {first_query}" in text
    assert sum(line.startswith("- ") and ", round " in line for line in text.splitlines()) == 2 * len(result["methods"])


def test_forgetting_plot_has_a_row_of_panels_per_metric_and_the_norm_panel(forgetting):
    result = forgetting[0]
    labels = [entry["label"] for entry in result["methods"].values()]
    titles = [panel.title for panel in forgetting_panels(result)]
    assert titles == [f"{label}: {metric}" for metric in METRICS.values() for label in labels] + ["New memory rows"]


def test_forgetting_reports_the_unfrozen_variants_lora_among_its_trainable_params(forgetting, backbone):
    methods = forgetting[0]["methods"]
    rows = TINY["tools"] * backbone.hidden_size
    assert methods["tokmem"]["trainable_params"] == methods["tokmem-norenorm"]["trainable_params"] == rows
    assert methods["tokmem-unfrozen"]["trainable_params"] == rows + lora_params(backbone)
    assert methods["replay"]["trainable_params"] == lora_params(backbone)


def test_no_study_changes_the_shared_backbone(main_study, generalization, forgetting, backbone, backbone_state):
    state = backbone.model.state_dict()
    assert state.keys() == backbone_state.keys() and all(torch.equal(state[k], backbone_state[k]) for k in state)
    assert not any(p.requires_grad for p in backbone.model.parameters())


@pytest.fixture(scope="module")
def unfrozen(backbone):
    """An UnfrozenTokMem after one round, and its adapter weights before it."""
    method = UnfrozenTokMem(
        backbone, LoRASettings(lr=1e-2), train=TrainConfig(max_length=64), decode=DecodeConfig(max_new_tokens=2)
    )
    before = {k: v.clone() for k, v in method.adapter.weights.items()}
    method.learn([example(call("f", x=1)), example(call("g", y=2))])
    return method, before


def test_unfrozen_tokmem_trains_lora_weights_jointly_with_its_rows(unfrozen):
    method, before = unfrozen
    assert any(not torch.equal(before[k], v) for k, v in method.adapter.weights.items())
    assert method.model.bank.names == ["f", "g"] and not method.model.bank.trainable.any()


def test_unfrozen_tokmem_saves_and_restores_its_rows_and_its_adapter(unfrozen, backbone, tmp_path):
    method, _ = unfrozen
    assert method.save(tmp_path)
    restored = UnfrozenTokMem(backbone, train=TrainConfig(seed=1))
    assert restored.load(tmp_path)
    assert restored.model.bank.names == ["f", "g"] and torch.equal(restored.model.bank.index, method.model.bank.index)
    assert all(torch.equal(restored.adapter.weights[k], v) for k, v in method.adapter.weights.items())


# ---- configuration and the command ---------------------------------------------------------------------------
def test_a_study_refuses_methods_it_cannot_run():
    with pytest.raises(TokMemError, match="forgetting study cannot run icl"):
        make_config(None, "forgetting", methods=("icl", "tokmem")).resolved()


def test_forgetting_needs_two_tools_a_round_to_compose_test_queries():
    with pytest.raises(TokMemError, match="two tools or more"):
        make_config(None, "forgetting", tools=5, rounds=3).resolved()


def test_the_cpu_preset_takes_the_forgetting_studys_own_sizes():
    main_config, forgetting_config = make_config("cpu", "main"), make_config("cpu", "forgetting", per_tool=7)
    assert main_config.tools == forgetting_config.tools == 10
    assert forgetting_config.test_multi < main_config.test_multi and forgetting_config.per_tool == 7


def test_the_cpu_presets_compare_methods_at_the_papers_one_epoch_and_at_a_longer_budget():
    for study in ("main", "generalization", "forgetting"):
        config = make_config("cpu", study)
        assert config.epoch_budgets[0] == 1 < config.epoch_budgets[1] and config.repeated(), study
    loop = make_config("cpu", "main", dataset="complexfuncbench")  # the tool loop: one budget, sized to the hour
    assert (loop.epoch_budgets, loop.epochs, loop.repeated()) == (None, 2, False)


def test_a_backbone_picks_the_presets_settings_sized_for_it():
    qwen = make_config(preset="cpu", backbone="qwen2.5-coder-0.5b", dataset="complexfuncbench")
    smollm2 = make_config(preset="cpu", backbone="smollm2-135m", dataset="complexfuncbench")
    assert (qwen.max_new_tokens, smollm2.max_new_tokens) == (256, 160)
    assert (qwen.train_multi, qwen.epochs, qwen.max_length, qwen.tokmem_lr) == (120, 2, 1536, 2e-2)
    assert make_config(preset="cpu", backbone="qwen2.5-coder-0.5b").max_new_tokens == 176  # the layer is the dataset's
    assert (
        make_config(
            preset="cpu", backbone="qwen2.5-coder-0.5b", dataset="complexfuncbench", max_new_tokens=64
        ).max_new_tokens
        == 64
    )
    assert atomic_config.make_config("cpu", backbone="qwen2.5-coder-0.5b") == replace(
        atomic_config.make_config("cpu"), backbone="qwen2.5-coder-0.5b"
    )


def test_an_unknown_preset_is_refused_naming_the_presets():
    with pytest.raises(TokMemError, match="unknown preset 'gpu': choose from cpu, paper"):
        make_config("gpu", "main")


def test_epochs_given_alone_replace_the_presets_budgets_and_given_with_budgets_are_refused():
    one = make_config("cpu", "main", epochs=2)  # else every run's epochs would come from the budgets: 2 unused
    assert (one.epochs, one.epoch_budgets, one.repeated()) == (2, None, False)
    assert make_config("cpu", "main", epoch_budgets=(2, 3)).epoch_budgets == (2, 3)
    with pytest.raises(TokMemError, match="--epochs and --epoch-budgets: give one"):
        make_config("cpu", "main", epochs=2, epoch_budgets=(1, 4))
    atomic = atomic_config.make_config  # atomic too
    assert atomic("cpu").repeated() and not atomic("cpu", epochs=2).repeated()
    assert main(["bench", "atomic", "--epochs", "2", "--epoch-budgets", "1,2", "--json", "unwritten.json"]) == 2


def test_one_run_is_saved_with_its_tables_by_the_writer_as_repeated_runs_are(tmp_path):
    config = make_config(None, "main", **TINY, methods=("icl",))
    assert not config.repeated()
    written = []
    result = run_all(config, progress=False, json_path=tmp_path / "one.json", write=written.append)
    assert written == [result] and "icl" in result["methods"]


def stop_early(path: Path, change) -> None:
    """Rewrite a saved result as a run stopped partway would have left it (``change`` edits its dict)."""
    saved = json.loads(path.read_text())
    change(saved)
    path.write_text(json.dumps(saved))


def test_resume_keeps_the_methods_the_json_finished_and_runs_the_others(backbone, tmp_path):
    path = tmp_path / "main.json"
    config = make_config(None, "main", **TINY, methods=("icl", "tokmem-noadapt"))
    first = run_all(config, backbone, progress=False, json_path=path)["methods"]

    def stopped_after_icl(saved):
        saved["methods"]["icl"]["eval_seconds"] = -1.0  # marks the entry: a kept one is not answered again
        del saved["methods"]["tokmem-noadapt"]

    stop_early(path, stopped_after_icl)
    resumed = run_all(config, backbone, progress=False, json_path=path, resume=True)["methods"]
    assert resumed["icl"]["eval_seconds"] == -1.0
    assert resumed["tokmem-noadapt"]["updates"] == first["tokmem-noadapt"]["updates"] > 0
    assert json.loads(path.read_text())["methods"] == resumed
    with pytest.raises(TokMemError, match=r"cannot resume .* other settings \(tools\)"):
        run_all(replace(config, tools=3), backbone, progress=False, json_path=path, resume=True)
    assert run_all(config, backbone, progress=False, json_path=path)["methods"]["icl"]["eval_seconds"] >= 0  # anew


def test_the_command_continues_a_stopped_run_of_a_repeated_study_without_being_asked(tmp_path):
    path = tmp_path / "main.json"
    options = ["bench", "compositional", "--json", str(path), "--backbone", "tiny-random", "--device", "cpu"]
    options += ["--tools", "3", "--per-tool", "3", "--train-multi", "2", "--test-multi", "2", "--max-length", "48"]
    options += ["--max-new-tokens", "2", "--methods", "icl,tokmem-noadapt", "--epoch-budgets", "1", "--quiet"]
    assert main(options) == 0
    run = path.with_name("main-runs") / "epochs1-seed0.json"

    def stopped_after_icl(saved):
        saved["methods"]["icl"]["eval_seconds"] = -1.0
        del saved["methods"]["tokmem-noadapt"], saved["finished"]

    stop_early(run, stopped_after_icl)
    assert main(options) == 0 and main([*options, "--resume"]) == 0  # --resume is accepted, and changes nothing here
    continued = json.loads(run.read_text())
    assert continued["finished"] and continued["methods"]["icl"]["eval_seconds"] == -1.0
    assert "tokmem-noadapt" in json.loads(path.read_text())["epoch_budgets"]["1"]["methods"]
    stop_early(run, lambda saved: saved.pop("finished"))
    assert main([*options, "--tools", "4"]) == 2  # a stopped run of other settings is refused, not overwritten
    assert "finished" not in json.loads(run.read_text())


def test_a_resumed_generalization_run_keeps_the_finished_methods_of_every_cap(backbone, tmp_path):
    path = tmp_path / "generalization.json"
    config = make_config(None, "generalization", **TINY, methods=("tokmem-noadapt",))
    compositional.run(config, backbone, progress=False, json_path=path)

    def stopped_in_cap_1(saved):
        del saved["train_max_calls"]["1"]["methods"]["tokmem-noadapt"]
        saved["train_max_calls"]["2"]["methods"]["tokmem-noadapt"]["train_seconds"] = -1.0

    stop_early(path, stopped_in_cap_1)
    resumed = compositional.run(config, backbone, progress=False, json_path=path, resume=True)
    caps = resumed["train_max_calls"]
    assert caps["1"]["methods"]["tokmem-noadapt"]["train_seconds"] >= 0  # learned again
    assert caps["2"]["methods"]["tokmem-noadapt"]["train_seconds"] == -1.0  # kept, though cap 1 rewrote the file first


def test_a_resumed_forgetting_run_keeps_a_method_that_finished_every_round_and_reruns_one_that_did_not(
    backbone, tmp_path
):
    path = tmp_path / "forgetting.json"
    config = make_config(None, "forgetting", **TINY, methods=("lora", "tokmem-noadapt"))
    compositional.run(config, backbone, progress=False, json_path=path)

    def stopped_in_round_2(saved):
        saved["methods"]["lora"]["rounds"][0]["train_seconds"] = -1.0
        saved["methods"]["tokmem-noadapt"]["rounds"][0]["train_seconds"] = -1.0
        del saved["methods"]["tokmem-noadapt"]["rounds"][1]

    stop_early(path, stopped_in_round_2)
    methods = compositional.run(config, backbone, progress=False, json_path=path, resume=True)["methods"]
    assert methods["lora"]["rounds"][0]["train_seconds"] == -1.0
    rounds = methods["tokmem-noadapt"]["rounds"]
    assert len(rounds) == 2 and rounds[0]["train_seconds"] >= 0  # every round again: a method's rows carry over


def point_methods(result: dict) -> dict[str, list[str]]:
    return {epochs: list(point["methods"]) for epochs, point in result["epoch_budgets"].items()}


def test_bench_compositional_command_writes_the_json_table_and_plot(tmp_path):
    path = tmp_path / "out" / "main.json"
    options = [
        "--backbone",
        "tiny-random",
        "--device",
        "cpu",
        "--tools",
        "3",
        "--per-tool",
        "3",
        "--train-multi",
        "2",
        "--test-multi",
        "2",
        "--max-length",
        "48",
        "--max-new-tokens",
        "2",
        "--methods",
        "icl,tokmem-noadapt",
        "--tokmem-lr",
        "0.02",
        "--epoch-budgets",
        "1,2",
        "--seeds",
        "0,1",
        "--quiet",
    ]
    assert main(["bench", "compositional", "--study", "main", "--json", str(path), *options]) == 0
    result = json.loads(path.read_text())
    assert (
        result["config"]["tokmem_lr"] == 0.02
        and result["seeds"] == [0, 1]
        and list(result["epoch_budgets"]) == ["1", "2"]
    )
    assert point_methods(result) == {"1": ["icl", "tokmem-noadapt"], "2": ["tokmem-noadapt"]}  # ICL trains nothing
    assert result["epoch_budgets"]["1"]["methods"]["icl"]["updates"] == 0
    for epochs, point in result["epoch_budgets"].items():
        tokmem = point["methods"]["tokmem-noadapt"]
        assert tokmem["label"] == TOKMEM_LABELS["tokmem-noadapt"] and point["adaptation"] is None
        assert tokmem["updates"] == int(epochs) * -(-point["data"]["train"] // 2)  # batch 2 (the config's default)
        assert (
            set(tokmem["call_f1"]["avg"]) == {"avg", "sd", "per_seed"}
            and len(tokmem["call_f1"]["avg"]["per_seed"]) == 2
        )
    assert [Path(p).name for p in result["runs"]] == [
        "epochs1-seed0.json",
        "epochs1-seed1.json",
        "epochs2-seed0.json",
        "epochs2-seed1.json",
    ]
    assert all(json.loads(Path(p).read_text())["finished"] for p in result["runs"])
    table = path.with_suffix(".md").read_text()
    assert (
        "# Budget curve" in table
        and "## At 2 epoch(s) each" not in table
        and "# At 2 epoch(s) each" in table
        and " ± " in table
    )
    assert path.with_suffix(".png").is_file()


def test_every_recipe_option_on_the_command_line_reaches_the_config():
    parser = argparse.ArgumentParser()
    cli.add_compositional(parser.add_subparsers())
    args = parser.parse_args(
        [
            "compositional",
            "--json",
            "x.json",
            "--epoch-budgets",
            "1,10",
            "--seeds",
            "0,1,2",
            "--warmup",
            "0.2",
            "--no-renorm-every-step",
            "--init",
            "mean",
            "--lr-schedule",
            "constant",
        ]
    )
    config = cli.compositional_config(args)
    assert (config.epoch_budgets, config.seeds, config.warmup) == ((1, 10), (0, 1, 2), 0.2)
    assert (config.renorm_every_step, config.init, config.schedule) == (False, "mean", "constant")


def test_the_recipe_preset_compares_its_tokmem_variants_at_one_budget():
    config = make_config("cpu", "recipe")
    assert (config.epochs, config.epoch_budgets, config.repeated()) == (4, None, False)


def test_a_runs_lora_adapter_is_kept_beside_its_results_with_what_rebuilds_it(backbone, tmp_path):
    from research.methods.lora import LoRA
    from research.studies.compositional import keep_bank
    from tokmem.training.lora import Adapter

    method = LoRA(backbone, lora=LoRASettings(rank=2))
    kept = keep_bank(method, tmp_path / "run.json")
    directory = Path(kept["adapter"])
    assert directory == tmp_path / "run-banks" / "lora.lora"
    settings = json.loads((directory / "adapter.json").read_text())
    assert settings["lora"]["rank"] == 2 and settings["backbone"]["fingerprint"] == backbone.fingerprint()
    again = Adapter(
        backbone.model,
        LoRASettings(**{**settings["lora"], "target_modules": tuple(settings["lora"]["target_modules"])}),
        seed=1,
    )
    assert again.load(directory)
    assert again.weights.keys() == method.adapter.weights.keys()
    assert all(torch.equal(again.weights[k], method.adapter.weights[k]) for k in again.weights)
    assert keep_bank(method, None) == {}


def test_lora_adapted_fine_tunes_the_backbone_tokmem_with_adaptation_trains_on(backbone, lively_backbone):
    from research.studies.tool_setup import build_method

    config = make_config("cpu", "main", dataset="complexfuncbench", methods=("lora-adapted", "lora"))
    backbones = {"base": backbone, "adapted": lively_backbone}
    adapted, plain = (build_method(name, config, backbones, {}) for name in config.methods)
    assert (adapted.name, adapted.backbone, adapted.label) == (
        "lora-adapted",
        lively_backbone,
        "Fine-tuning (w/ adapt)",
    )
    assert (plain.name, plain.backbone) == ("lora", backbone)
