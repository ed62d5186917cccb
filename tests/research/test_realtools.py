"""The compositional study on real data: ComplexFuncBench to evaluate, BFCL multi-turn or its own flight tools to adapt."""

import hashlib
import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from tokmem.bank.memory_bank import MemoryBank
from tokmem.data import shared
from tokmem.data.procedures import Example, Step
from research.studies.realtools import (
    FLIGHT_TOOLS,
    complexfuncbench_data,
    covering_sample,
    function_calling_dir,
    hash_split,
    query_hash,
    three_way_split,
)
from tokmem.errors import DataError, TokMemError
from research.studies import compositional, compositional_report
from research.studies.compositional_config import make_config
from research.studies.outputs import spread
from research.studies.tool_setup import prepare_backbones

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "function-calling"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} is absent")


def examples(n):
    return [Example(f"query {k}", (Step("f", '{"name":"f","arguments":{}}'),)) for k in range(n)]


def test_the_hash_split_depends_on_each_query_alone_not_on_order_or_neighbours():
    train, test = hash_split(examples(200), 0.2)
    assert 20 < len(test) < 60 and len(train) + len(test) == 200
    assert all(query_hash(e.query) < 0.2 for e in test) and all(query_hash(e.query) >= 0.2 for e in train)
    assert hash_split(examples(200)[::-1], 0.2) == (train, test)
    assert set(hash_split(examples(100), 0.2)[1]) == {e for e in test if int(e.query.split()[1]) < 100}


def test_the_three_way_split_is_by_query_hash_alone_disjoint_and_the_same_in_any_order():
    train, dev, test = three_way_split(examples(300), 0.2, 0.18)
    assert all(query_hash(e.query) < 0.2 for e in test) and all(0.2 <= query_hash(e.query) < 0.38 for e in dev)
    assert len(train) + len(dev) + len(test) == 300 and len({e.query for e in train + dev + test}) == 300
    assert three_way_split(examples(300)[::-1], 0.2, 0.18) == (train, dev, test)
    assert hash_split(examples(300), 0.2)[1] == test  # the test side of the two-way split, as before


def test_a_covering_sample_calls_every_tool_asked_for_even_one_a_single_record_calls():
    def calling(tool: str, k: int) -> Example:
        return Example(f"{tool} {k}", (Step(tool, "{}"),))

    pool = [calling("common", k) for k in range(50)] + [calling("rare", 0)]
    for seed in range(5):
        sample = covering_sample(pool, 10, {"rare", "common", "absent"}, random.Random(seed))
        assert len(sample) == len(set(sample)) == 10 and calling("rare", 0) in sample
    assert covering_sample(pool, 10, {"rare"}, random.Random(1)) == covering_sample(
        pool, 10, {"rare"}, random.Random(1)
    )
    with pytest.raises(DataError, match="1 training records cannot call every tool"):
        covering_sample(pool, 1, {"rare", "common"}, random.Random(0))


def test_a_missing_data_folder_says_which_flag_or_variable_to_set(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(shared, "SEARCH_DEPTH", 1)  # only the working directory: a shared/data above tmp is not found
    monkeypatch.delenv("TOKMEM_SHARED_DATA", raising=False)
    with pytest.raises(DataError, match="pass --data-dir DIR"):
        function_calling_dir()
    with pytest.raises(DataError, match=r"complexfuncbench-data.json.gz not found \(--data-dir\)"):
        function_calling_dir(str(tmp_path))
    monkeypatch.setenv("TOKMEM_SHARED_DATA", str(tmp_path))
    with pytest.raises(DataError, match=r"\$TOKMEM_SHARED_DATA"):
        function_calling_dir()


def test_real_data_is_a_main_or_recipe_study_from_one_source():
    with pytest.raises(TokMemError, match="runs the main and recipe studies, not forgetting"):
        make_config(None, "forgetting", dataset="complexfuncbench").resolved()
    with pytest.raises(TokMemError, match="two data sources"):
        make_config(None, "main", dataset="complexfuncbench", xlam="x.json").resolved()
    with pytest.raises(TokMemError, match="unknown dataset 'cfb'"):
        make_config(None, "main", dataset="cfb").resolved()
    with pytest.raises(TokMemError, match="--test-data, --test-spec, --adapt-data and --split need --dataset complex"):
        make_config(None, "main", test_data="mine.json").resolved()
    with pytest.raises(TokMemError, match="--split need --dataset complexfuncbench"):
        make_config(None, "main", split="dev").resolved()
    with pytest.raises(TokMemError, match="--adapt-data and --split need --dataset complexfuncbench"):
        make_config(None, "main", adapt_data=("flights",)).resolved()
    with pytest.raises(
        TokMemError, match="adaptation data 'bfcl,cars': choose from bfcl, bfcl-executed, flights, chains, study"
    ):
        make_config(None, "main", dataset="complexfuncbench", adapt_data=("bfcl", "cars")).resolved()
    with pytest.raises(TokMemError, match="the same turns, without and with results: pick one"):
        make_config(None, "main", dataset="complexfuncbench", adapt_data=("bfcl", "bfcl-executed")).resolved()


def test_the_cpu_preset_takes_the_real_datas_own_sizes():
    config = make_config("cpu", "main", dataset="complexfuncbench")
    assert (config.train_multi, config.test_multi, config.max_calls, config.epochs) == (120, None, 4, 2)
    assert config.split == "dev"  # every record of the development split answered
    assert (config.init, config.schedule, config.epoch_budgets) == ("mean", "linear", None)  # routing settles
    assert config.tokmem_lr > make_config("cpu", "main").tokmem_lr  # faster rows; LoRA's rate as elsewhere
    assert config.lora_lr == make_config("cpu", "main").lora_lr
    assert make_config("cpu", "main").train_multi == 120


@needs_shared
def test_complexfuncbench_trains_and_tests_on_disjoint_records_and_adapts_on_disjoint_bfcl_tools():
    real = complexfuncbench_data(
        SHARED, max_calls=4, train_size=150, test_size=24, adapt_samples=300, adapt_data=("bfcl",)
    )
    data = real.data
    assert (len(data.train), len(data.test), len(real.adaptation)) == (150, 24, 300)
    assert not {e.query for e in data.train} & {e.query for e in data.test}
    assert all(2 <= len(e.steps) <= 4 for e in data.train + data.test)
    assert {p for e in data.train + data.test for p in e.procedures} == set(data.tools)
    assert not {p for e in real.adaptation for p in e.procedures} & set(data.tools)
    assert real.left_out["ComplexFuncBench records with more than 4 calls"] == 786 - 306
    splits, unknown = real.summary()["splits"], real.left_out["dev records calling a tool no training record calls"]
    assert real.left_out["dev records beyond 24"] + 24 == splits["dev"]["records"]
    assert real.left_out["training records beyond 150"] + 150 == splits["train"]["records"]
    assert sum(part["records"] for part in splits.values()) + unknown == 306


@needs_shared
def test_adapting_on_the_flight_tools_holds_them_out_of_the_evaluation_and_keeps_their_results():
    real = complexfuncbench_data(
        SHARED, max_calls=4, train_size=150, test_size=24, adapt_samples=300, adapt_data=("bfcl", "flights")
    )
    flights = [e for e in real.adaptation if FLIGHT_TOOLS.issuperset(e.procedures)]
    assert real.summary()["adaptation"] == {"bfcl": 300, "flights": len(flights)} and len(flights) == 118
    assert all(step.result is not None for e in flights for step in e.steps)  # the results the loop reads
    assert max(len(e.steps) for e in flights) > 4  # the adaptation is not bound by the evaluation's call count
    evaluated = {p for e in real.data.train + real.data.test for p in e.procedures}
    assert not evaluated & {p for e in real.adaptation for p in e.procedures}
    assert real.left_out["records calling a flight tool (held out to adapt)"] == 27
    alone = complexfuncbench_data(SHARED, max_calls=4, train_size=150, test_size=24, adapt_data=("flights",))
    assert alone.adaptation == flights and alone.data.test == real.data.test
    config = make_config(None, "main", dataset="complexfuncbench", adapt_data=("flights",))
    assert compositional.data_source(config).endswith("; ComplexFuncBench's flight tools (held out) to adapt")


@needs_shared
def test_the_splits_are_disjoint_the_same_at_every_seed_and_test_every_hash_test_record_the_loop_can_score():
    def data(split: str, seed: int):
        return complexfuncbench_data(SHARED, train_size=120, adapt_samples=3, seed=seed, split=split)

    runs = {(split, seed): data(split, seed) for split in ("dev", "test") for seed in (0, 1, 2)}
    for seed in (0, 1, 2):
        dev, test = runs["dev", seed], runs["test", seed]
        assert dev.data.train == test.data.train  # the split answered changes nothing of the training
        assert [e.query for e in dev.data.test] == [e.query for e in runs["dev", 0].data.test]
        assert [e.query for e in test.data.test] == [e.query for e in runs["test", 0].data.test]
        trained, answered = {e.query for e in dev.data.train}, {e.query for e in dev.data.test + test.data.test}
        assert not trained & answered and not {e.query for e in dev.data.test} & {e.query for e in test.data.test}
        tools = {p for e in dev.data.train for p in e.procedures}
        assert all(tools.issuperset(e.procedures) for e in dev.data.test + test.data.test)  # answerable at any seed
    assert runs["dev", 0].data.train != runs["dev", 1].data.train  # each seed its own sample of the pool
    assert len(runs["dev", 0].data.test) >= 40
    hash_test = complexfuncbench_data(SHARED, adapt_samples=3, split="test").data.test  # the whole training pool
    assert {e.query for e in runs["test", 0].data.test} == {e.query for e in hash_test}
    assert all(query_hash(e.query) < 0.2 for e in hash_test) and len(hash_test) == 73  # every one, not the first 24
    assert runs["test", 0].summary()["splits"] == {
        "train": {"records": 181, "steps": 587},
        "dev": {"records": 51, "steps": 160},
        "test": {"records": 73, "steps": 236},
    }  # research/docs/studies.md "Splits"


@needs_shared
def test_a_test_run_answers_the_whole_test_split():
    with pytest.raises(DataError, match="a test run answers every one of the 73 test records"):
        complexfuncbench_data(SHARED, test_size=24, adapt_samples=3, split="test")


def test_a_test_run_is_refused_without_a_preset_file_and_records_the_files_path_and_hash(tmp_path):
    with pytest.raises(TokMemError, match="--split test reads the test once.*pass --preset-file FILE"):
        make_config("cpu", dataset="complexfuncbench", split="test").resolved()
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps({"tokmem_lr": 0.01, "adapt_data": ["chains"], "backbone": "tiny-random"}))
    config = make_config("cpu", dataset="complexfuncbench", split="test", seed=1, preset_file=str(recipe)).resolved()
    assert (config.split, config.seed, config.tokmem_lr, config.adapt_data) == ("test", 1, 0.01, ("chains",))
    assert config.preset_file == str(recipe)
    assert config.preset_sha256 == hashlib.sha256(recipe.read_bytes()).hexdigest()
    assert make_config("cpu", dataset="complexfuncbench", preset_file=str(recipe)).split == "dev"  # a file alone
    with pytest.raises(TokMemError, match="recipe.json sets backbone, tokmem_lr: leave those options unset"):
        make_config("cpu", dataset="complexfuncbench", preset_file=str(recipe), tokmem_lr=0.02, backbone="x")
    assert make_config("cpu", dataset="complexfuncbench", preset_file=str(recipe), tokmem_lr=0.01).tokmem_lr == 0.01
    recipe.write_text(json.dumps({"lr": 0.01, "study": "recipe"}))
    with pytest.raises(TokMemError, match="not settings of the study: lr, study"):
        make_config("cpu", preset_file=str(recipe))
    with pytest.raises(TokMemError, match="--preset-file .*missing.json"):
        make_config("cpu", preset_file=str(tmp_path / "missing.json"))


def cfb(**options):
    """ComplexFuncBench's 4-call records, 150 to train and 24 to test, adapting as ``options`` say."""
    return complexfuncbench_data(SHARED, max_calls=4, train_size=150, test_size=24, **options)


@needs_shared
def test_adapting_on_executed_bfcl_turns_gives_each_call_its_result_on_tools_disjoint_from_the_evaluation():
    plain, real = cfb(adapt_samples=120, adapt_data=("bfcl",)), cfb(adapt_samples=120, adapt_data=("bfcl-executed",))
    assert real.adaptation_sources == {"bfcl-executed": 120} and real.data.test == plain.data.test
    assert [e.id for e in real.adaptation] == [e.id for e in plain.adaptation]  # the same turns, now with results
    assert all(s.result is None for e in plain.adaptation for s in e.steps)
    assert all(s.result is not None for e in real.adaptation for s in e.steps)
    assert not {p for e in real.adaptation for p in e.procedures} & set(real.data.tools)


@needs_shared
def test_the_default_adaptation_is_as_many_seeded_synthetic_chains_with_results_on_tools_of_their_own():
    plain, real = cfb(adapt_samples=40, adapt_data=("bfcl",)), cfb(adapt_samples=40)
    assert real.adaptation_sources == {"chains": 40} and real.data.test == plain.data.test
    assert all(s.result is not None for e in real.adaptation for s in e.steps)
    assert not {p for e in real.adaptation for p in e.procedures} & set(real.data.tools)
    assert cfb(adapt_samples=40, seed=1).adaptation != real.adaptation


@needs_shared
def test_an_adaptation_source_sharing_a_tool_with_the_evaluation_is_refused_naming_the_tool(tmp_path):
    data = tmp_path / "weather.json"
    data.write_text(json.dumps(convert_units_records(40, tool="Get_Forecast")))  # a tool the chains call too
    complexfuncbench_data(SHARED, max_calls=2, adapt_samples=3, test_data=str(data), split="test", adapt_data=("bfcl",))
    with pytest.raises(DataError, match="adaptation data 'chains' .*both have Get_Forecast; adapt on another source"):
        complexfuncbench_data(SHARED, max_calls=2, adapt_samples=40, test_data=str(data), split="test")  # the default


def test_the_diagnostic_adaptation_on_the_studys_own_records_is_its_training_records_and_says_so():
    real = complexfuncbench_data(SHARED, max_calls=4, train_size=150, test_size=24, adapt_data=("study",))
    assert real.adaptation == real.data.train and real.summary()["adaptation"] == {"study": 150}
    config = make_config(None, "main", dataset="complexfuncbench", adapt_data=("study",))
    assert compositional.data_source(config).endswith(
        "training records (a diagnostic: the evaluation's tools) to adapt"
    )


@needs_shared
def test_a_users_own_test_file_replaces_the_hash_splits_test_side(tmp_path):
    mine = SHARED / "complexfuncbench" / "complexfuncbench-data.json.gz"
    real = complexfuncbench_data(SHARED, max_calls=2, adapt_samples=3, test_data=str(mine), split="test")
    assert len(real.data.train) == real.summary()["splits"]["train"]["records"] == 38  # the training pool, as ever
    assert len(real.data.test) == 63  # every 2-call record of the file (ComplexFuncBench itself) tests
    dev = complexfuncbench_data(SHARED, max_calls=2, adapt_samples=3, test_data=str(mine))
    assert dev.data.train == real.data.train and len(dev.data.test) == 11  # dev answers the hash split's dev records


def tiny_real_config(**options):
    sizes = dict(max_calls=2, train_multi=4, test_multi=2, adapt_multi=2, max_length=96, max_new_tokens=4)
    return make_config(
        None,
        "main",
        dataset="complexfuncbench",
        data_dir=str(SHARED),
        backbone="tiny-random",
        device="cpu",
        **sizes | options,
    )


def routing_cell(table: str) -> str:
    """The Routing F1 cell of TokMem (w/ adapt)'s row in a markdown table."""
    return next(r for r in table.splitlines() if r.startswith("| TokMem (w/ adapt) |")).split(" | ")[3]


@needs_shared
def test_the_tool_loop_study_scores_every_method_per_step_and_end_to_end_at_equal_updates(backbone):
    config = tiny_real_config(methods=("icl", "lora", "tokmem", "tokmem-noschema"), max_length=1024)
    result = compositional.run(config, backbone, progress=False)
    methods = result["methods"]
    for name, entry in methods.items():
        routing = {"routing_f1"} if name.startswith("tokmem") else set()  # per step: the memory tokens' choices
        counts = {"exact_steps", "steps"}
        assert set(entry["step"]) == {"tool_f1", "arg_f1", "call_f1"} | routing | counts
        assert set(entry["end_to_end"]) == {"tool_f1", "arg_f1", "call_f1"} | counts
        for part in ("step", "end_to_end"):
            assert all(set(scores) == {"2", "all"} for scores in entry[part].values())
        assert {"trainable_params", "updates"} <= set(entry)
    assert methods["lora"]["updates"] == methods["tokmem"]["updates"] == methods["tokmem-noschema"]["updates"] > 0
    assert methods["icl"]["updates"] == 0
    assert methods["tokmem-noschema"]["label"] == "TokMem (w/ adapt; free arguments)"
    report = compositional_report.markdown(result)
    assert "## Per step" in report and "## End to end" in report and "free arguments" in report
    per_step, end_to_end = report.split("## End to end")
    assert routing_cell(per_step) == spread(methods["tokmem"]["step"]["routing_f1"]["all"])  # memory tokens' choices
    assert routing_cell(end_to_end) == "–"  # scored per step only


@needs_shared
def test_a_resumed_loop_run_learns_tokmem_again_when_its_free_arguments_row_is_missing(backbone, tmp_path):
    path = tmp_path / "loop.json"
    config = tiny_real_config(methods=("tokmem", "tokmem-noschema"), max_length=1024)
    compositional.run(config, backbone, progress=False, json_path=path)
    saved = json.loads(path.read_text())
    kept = MemoryBank.load(saved["methods"]["tokmem"]["bank"])  # the trained bank beside the results
    assert Path(saved["methods"]["tokmem"]["bank"]).parent == tmp_path / "loop-banks"
    assert kept.names == list(saved["data"]["tools"]) and "bank" not in saved["methods"]["tokmem-noschema"]
    norms = saved["methods"]["tokmem"]["row_norms"]
    assert norms["norms"] == pytest.approx(kept.norms().tolist()) and norms["token_norm"] > 0
    saved["methods"]["tokmem"]["train_seconds"] = -1.0
    del saved["methods"]["tokmem-noschema"]  # stopped before the ablation row, which answers with TokMem's bank
    path.write_text(json.dumps(saved))
    methods = compositional.run(config, backbone, progress=False, json_path=path, resume=True)["methods"]
    assert methods["tokmem"]["train_seconds"] >= 0 and "tokmem-noschema" in methods


@needs_shared
def test_tokmem_with_schemas_shown_trains_as_many_updates_and_reads_each_chosen_tools_schema(backbone):
    config = tiny_real_config(methods=("tokmem-noadapt",), max_length=1024)
    plain = compositional.run(config, backbone, progress=False)["methods"]["tokmem-noadapt"]
    shown = compositional.run(replace(config, show_schemas=True), backbone, progress=False)["methods"]["tokmem-noadapt"]
    assert shown["updates"] == plain["updates"] > 0 and shown["label"] == "TokMem (w/o adapt; schema shown)"
    assert shown["prompt_tokens_per_call"] > plain["prompt_tokens_per_call"]  # each call's schema after its token
    with pytest.raises(TokMemError, match="--show-schemas answers in the tool loop only"):
        make_config(None, "main", show_schemas=True).resolved()


@needs_shared
def test_tokmem_with_two_memory_tokens_a_tool_adapts_and_trains_in_that_layout_on_twice_the_parameters(
    backbone, tmp_path
):
    config = tiny_real_config(methods=("tokmem",), max_length=1024, adapt_cache=str(tmp_path))
    plain = compositional.run(config, backbone, progress=False)
    tails = compositional.run(replace(config, memory_tokens=2), backbone, progress=False)
    assert tails["adaptation"]["directory"] != plain["adaptation"]["directory"]  # the adaptation had tails too
    plain, tails = plain["methods"]["tokmem"], tails["methods"]["tokmem"]
    assert tails["updates"] == plain["updates"] > 0
    assert tails["trainable_params"] == 2 * plain["trainable_params"]
    assert tails["prompt_tokens_per_call"] > plain["prompt_tokens_per_call"]  # each call's tail after its token
    with pytest.raises(TokMemError, match="--memory-tokens answers in the tool loop only"):
        make_config(None, "main", memory_tokens=2).resolved()


def test_the_tool_loop_adds_the_free_arguments_row_and_leaves_the_constant_lr_row_out_of_the_default_methods():
    loop = make_config(None, "main", dataset="complexfuncbench").resolved()
    plain = make_config(None, "main", dataset="complexfuncbench", results_in_context=False).resolved()
    assert loop.methods[-1] == "tokmem-noschema" and "tokmem-noschema" not in plain.methods
    assert "tokmem-better" in plain.methods and "tokmem-better" not in loop.methods
    chosen = make_config(None, "main", dataset="complexfuncbench", methods=("tokmem-better",)).resolved()
    assert chosen.methods == ("tokmem-better",)  # still there when asked for


@needs_shared
def test_a_nestful_test_file_takes_its_spec_from_the_flag(tmp_path):
    record = {
        "input": "Find attractions in Paris.",
        "output": [
            {"name": "Search_Attraction_Location", "arguments": {"query": "Paris"}, "label": "var1", "response": []},
            {"name": "Search_Attractions", "arguments": {"id": "$var1.0.id$"}, "label": "var2", "response": {}},
        ],
    }
    data, spec = tmp_path / "held-out.json", tmp_path / "tools.json"
    data.write_text(json.dumps([record]))
    catalog = [
        {"name": name, "description": "d", "parameters": {"type": "object", "properties": {}}}
        for name in ("Search_Attraction_Location", "Search_Attractions")
    ]
    spec.write_text(json.dumps(catalog))
    with pytest.raises(DataError, match="no tool schemas"):
        complexfuncbench_data(SHARED, max_calls=2, adapt_samples=3, test_data=str(data), split="test")
    real = complexfuncbench_data(
        SHARED, max_calls=2, adapt_samples=3, test_data=str(data), split="test", test_spec=str(spec)
    )
    assert [e.query for e in real.data.test] == ["Find attractions in Paris."]
    with pytest.raises(TokMemError, match="--test-spec is the spec of --test-data"):
        make_config(None, "main", dataset="complexfuncbench", test_spec=str(spec)).resolved()


@needs_shared
def test_the_real_data_main_study_runs_end_to_end_on_the_tiny_model(backbone):
    config = make_config(
        None,
        "main",
        dataset="complexfuncbench",
        data_dir=str(SHARED),
        results_in_context=False,
        methods=("rag", "tokmem"),
        backbone="tiny-random",
        max_calls=2,
        train_multi=4,
        test_multi=2,
        adapt_multi=2,
        max_length=96,
        max_new_tokens=4,
        device="cpu",
        rag_k=2,
    )
    result = compositional.run(config, backbone, progress=False)
    assert result["data"]["source"].startswith("ComplexFuncBench (split by query hash")
    assert (result["data"]["train"], result["data"]["test"], result["adaptation"]["examples"]) == (4, 2, 2)
    assert (
        result["data"]["train_calls"] == {2: 4}
        and "ComplexFuncBench records with more than 2 calls" in result["data"]["left_out"]
    )
    assert set(result["methods"]) == {"rag", "tokmem"} and result["methods"]["tokmem"]["trainable_params"] > 0
    assert "Left out:" in compositional_report.markdown(result)


def convert_units_records(count: int, tool: str = "convert_units") -> list[dict]:
    """NESTFUL records over a tool ComplexFuncBench does not have."""
    spec = {"name": tool, "description": "d", "parameters": {"type": "object", "properties": {}}}
    return [
        {
            "input": f"Convert {n} miles to km.",
            "output": [{"name": tool, "arguments": {"value": n}, "label": "var1", "response": {"km": n}}],
            "tools": [spec],
        }
        for n in range(count)
    ]


@needs_shared
def test_any_nestful_file_runs_its_unknown_tools_trained_on_part_of_it(tmp_path):
    data = tmp_path / "other.json"
    data.write_text(json.dumps(convert_units_records(40)))
    real = complexfuncbench_data(SHARED, max_calls=2, adapt_samples=3, test_data=str(data), split="test")
    mine = [e for e in real.data.train if e.procedures == ["convert_units"]]
    assert real.data.test and all(e.procedures == ["convert_units"] for e in real.data.test)
    assert mine and len(mine) + len(real.data.test) == 40  # split by query hash: every record on one side
    assert not {e.query for e in mine} & {e.query for e in real.data.test}
    assert len(real.data.train) == 38 + len(mine)  # ComplexFuncBench's 2-call training pool trains as well


@needs_shared
def test_a_test_file_too_small_to_train_its_unknown_tools_is_refused_saying_what_was_left_out(tmp_path):
    data = tmp_path / "other.json"
    data.write_text(json.dumps(convert_units_records(1)))
    with pytest.raises(DataError, match=r"other\.json: \d+ training and 0 test records"):
        complexfuncbench_data(SHARED, max_calls=2, adapt_samples=3, test_data=str(data), split="test")


@needs_shared
def test_named_results_open_each_result_with_its_tools_name_on_both_sides_and_change_nothing_else():
    from research.studies.tool_setup import real_data

    plain, named = (real_data(tiny_real_config(name_results=chosen)) for chosen in (False, True))
    for before, after in zip(plain.data.train + plain.data.test, named.data.train + named.data.test):
        assert [s.procedure for s in before.steps] == [s.procedure for s in after.steps]
        for old, new in zip(before.steps, after.steps):
            assert new.response == old.response and new.result == f"[{old.procedure}] {old.result}"
    with pytest.raises(TokMemError, match="--name-results answers in the tool loop only"):
        make_config(None, "main", name_results=True).resolved()


@needs_shared
def test_the_key_order_of_the_banks_rows_does_not_change_the_adaptation_it_trains_on(backbone, tmp_path):
    """The adaptation's temporary rows have no schemas: no key order binds them, so one cached adaptation serves
    every key order (an A/B of the order re-adapts nothing)."""
    calls = tiny_real_config(methods=("tokmem",), adapt_cache=str(tmp_path))
    _, first = prepare_backbones(calls, backbone, progress=False)
    _, again = prepare_backbones(replace(calls, key_order="given"), backbone, progress=False)
    assert not first["cached"] and again["cached"] and again["directory"] == first["directory"]
