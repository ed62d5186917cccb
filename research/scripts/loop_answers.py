"""What a tool-loop study's per-step answers get wrong, read from its result file's samples.

Each per-step answer is read as the scorer reads it (`metrics.read_call`: canonical arguments) and set against the
gold call it was due for, counted by its outcome (`tokmem.eval.steps.outcome`: exact, wrong tool, wrong key set,
wrong values, a verbatim repeat of an earlier call of the record, not a JSON call, no call), in all and apart for the
tools whose schema lists their keys out of the calls' order.

Each gold argument value is also counted by where the model could have read it (`origin`): in the query, in an earlier
result as the sequence shows it (cut to the study's result budget), only in the part of a result the cut hides, or
nowhere (rewritten: a date from "December 15th", a sum): and how often the answer has it, a value counting as right
only when the answer names the right tool; the gold keys an answer of the right tool left out, by the same origin (an
optional key the query asked for: ``query``), and the keys it added; and each wrong value of a wrong-values step by
what it is instead (``tokmem.eval.steps.value_error``: empty, another key's, a date shifted, cut short or run on,
another number, other text of the context, elsewhere) and by how many of its values are wrong and whether they are all
of one kind (the steps a lever aimed at that kind alone could mend). A wrong value of the right tool is also looked up
among the training records' values of that argument: a value recalled from training, not read from the context. The
test records are rebuilt from the study's own config (the data under ``../shared/data/function-calling`` or
``--data-dir``), and the cut is measured with the study's backbone's tokenizer (``--result-tokens`` asks what another
budget would show). Files written before the samples kept no-call steps in place (their ``step`` lists are shorter
than ``gold``) are read over their aligned records only.

    python -m research.scripts.loop_answers results/loop-cfb-flights.json [more.json ...] [--json OUT]  # or loop_ab.py files
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import fields, replace

from tokmem.backbones import load_backbone
from tokmem.data.procedures import Example
from tokmem.eval.metrics import read_call
from tokmem.io import write_json_atomic
from tokmem.eval.steps import OUTCOMES, VALUE_ERRORS, outcome, value_error
from tokmem.schemas import learned_schema
from tokmem.training.sequences import RESULT_TOKENS
from research.results import read_result
from research.studies.compositional_config import CompositionalConfig, make_config
from research.studies.tool_setup import real_data

Call = tuple  # (name, canonical arguments), as the scorer reads a call (`metrics.read_call`)
METHOD = "tokmem-noadapt"  # a ``loop_ab.py`` variant's method unless its settings name another (``tokmem``: adapted)
ORIGINS = ("query", "result as shown", "past the cut", "rewritten")
GROUPS = ("schema in the calls' order", "schema out of the calls' order")


def origin(value, query: str, shown: list[str], whole: list[str]) -> str:
    """Where a gold value's text first appears to the model (see the module docstring)."""
    text = str(value).lower()
    if text in query.lower():
        return "query"
    if any(text in result for result in shown):
        return "result as shown"
    return "past the cut" if any(text in result for result in whole) else "rewritten"


def value_origins(example: Example, tokenizer, budget: int = RESULT_TOKENS) -> list[dict[str, str]]:
    """Per step of ``example``, each gold argument's key → the origin of its value."""
    shown, whole, origins = [], [], []
    for step in example.steps:
        arguments = json.loads(step.response)["arguments"]
        origins.append({key: origin(value, example.query, shown, whole) for key, value in arguments.items()})
        if step.result:
            ids = tokenizer(step.result, add_special_tokens=False)["input_ids"]
            shown.append(tokenizer.decode(ids[:budget]).lower())
            whole.append(step.result.lower())
    return origins


def trained_values(train: list[Example]) -> set[tuple]:
    """Every (tool, argument, canonical value) the training records' gold calls hold."""
    calls = (read_call(step.response) for example in train for step in example.steps)
    return {(name, key, value) for name, arguments in calls for key, value in arguments}


def reordered_tools(tools: dict[str, dict], train: list[Example]) -> set[str]:
    """The tools whose schema lists their keys in another order than the training calls write them (the order a
    bank's schema takes since ``schemas.learned_schema``; before, the grammar wrote them in the schema's)."""
    return {
        name
        for name, tool in tools.items()
        if (schema := tool.get("parameters"))
        and (learned := list(learned_schema(schema, name, train)["properties"]))
        != [key for key in schema["properties"] if key in learned]  # the keys no call gave are left out
    }


def summary(
    samples: list[dict],
    examples: dict[str, Example],
    trained: set[tuple],
    reordered: set[str],
    tokenizer,
    budget: int = RESULT_TOKENS,
) -> dict:
    aligned = [s for s in samples if len(s["step"]) == len(s["gold"])]
    counts, values, wrong, order, left_out, errors, spread, alone = (Counter() for _ in range(8))
    for sample in aligned:
        example = examples[sample["query"]]
        origins = value_origins(example, tokenizer, budget)
        for k, (gold_text, text, where) in enumerate(zip(sample["gold"], sample["step"], origins)):
            gold, answer = read_call(gold_text), None if text is None else read_call(text)
            kind = outcome(gold_text, text, sample["gold"][:k])
            counts[kind] += 1
            group = "schema out of the calls' order" if gold[0] in reordered else "schema in the calls' order"
            order[group, "total"] += 1
            order[group, kind] += 1
            right_tool = answer is not None and answer[0] == gold[0]
            given = dict(answer[1]) if right_tool else {}
            if right_tool:
                left_out.update(where[key] for key in dict(gold[1]) if key not in given)
                left_out["added"] += len(given.keys() - dict(gold[1]).keys())
            kinds_here, past = [], [step.result for step in example.steps[:k]]
            for key, value in dict(gold[1]).items():
                values[where[key], "total"] += 1
                values[where[key], "right"] += key in given and given[key] == value
                if key in given and given[key] != value:
                    wrong["total"] += 1
                    wrong["from training"] += (gold[0], key, given[key]) in trained
                    if kind == "wrong values":
                        kinds_here.append(value_error(given[key], value, dict(gold[1]), example.query, past))
            errors.update(kinds_here)
            if kind == "wrong values":
                spread[min(len(kinds_here), 3)] += 1
                alone.update(set(kinds_here) if len(set(kinds_here)) == 1 else ())
    return {
        "records": f"{len(aligned)} of {len(samples)}",
        "steps": sum(counts.values()),
        **{kind: counts[kind] for kind in OUTCOMES},
        "values right, by origin": {o: f"{values[o, 'right']} of {values[o, 'total']}" for o in ORIGINS},
        "wrong values recalled from training": f"{wrong['from training']} of {wrong['total']}",
        "wrong values of the wrong-values steps, by kind": {kind: errors[kind] for kind in VALUE_ERRORS},
        "wrong-values steps, by how many values are wrong": {"1": spread[1], "2": spread[2], "3 or more": spread[3]},
        "wrong-values steps whose wrong values are all of one kind": {kind: alone[kind] for kind in VALUE_ERRORS},
        "keys of the right tool left out, by origin": {o: left_out[o] for o in ORIGINS},
        "keys of the right tool added": left_out["added"],
        "exact steps, by the tool's schema order": {g: f"{order[g, 'exact']} of {order[g, 'total']}" for g in GROUPS},
        "outcomes, by the tool's schema order": {g: {k: order[g, k] for k in OUTCOMES} for g in GROUPS},
    }


def study_data(config: CompositionalConfig) -> tuple[dict[str, Example], set[tuple], set[str]]:
    """The test records of the study ``config`` describes, by query, its training values and its tools whose schema
    lists their keys out of the calls' order."""
    data = real_data(config).data
    return {e.query: e for e in data.test}, trained_values(data.train), reordered_tools(data.tools, data.train)


def variant_config(base: dict, backbone: str, settings: dict) -> CompositionalConfig:
    """A ``loop_ab.py`` variant's study: the preset, dataset, seed, split and preset file of its file's ``config``
    (``base``), with the variant's ``settings`` (a JSON list read as a tuple; its method `METHOD` unless they name
    another).  A file from before the splits answered records that the test split holds (the first 24 of them)."""
    chosen = {"methods": (METHOD,), **_tuples(settings)}
    study = dict(seed=base["seed"], split=base.get("split", "test"), preset_file=base.get("preset_file"))
    return make_config(base["preset"], dataset=base["dataset"], backbone=backbone, **study, **chosen)


def answered(result: dict, data_dir: str | None) -> Iterator[tuple[str, CompositionalConfig, list[dict]]]:
    """(label, the study's config, samples) of each method of a study's result file, or of each variant of a
    ``loop_ab.py`` file."""
    directory = {"data_dir": data_dir} if data_dir else {}
    if "variants" in result:
        for name, variant in result["variants"].items():
            config = variant_config(result["config"], result["backbone"], variant["settings"])
            yield name, replace(config, **directory), variant["samples"]
        return
    names = {f.name for f in fields(CompositionalConfig)}
    settings = _tuples({k: v for k, v in result["config"].items() if k in names})
    if "split" not in settings:  # a run from before the splits: its records are among the test split's
        settings |= {"split": "test", "test_multi": None}
    config = replace(CompositionalConfig(), **settings | directory)
    for name, method in result["methods"].items():
        yield method.get("label", name), config, method["samples"]


def _tuples(settings: dict) -> dict:
    return {key: tuple(value) if isinstance(value, list) else value for key, value in settings.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--data-dir", help="the function-calling data folder, when not ../shared/data's")
    parser.add_argument(
        "--result-tokens", type=int, default=RESULT_TOKENS, help="the result budget to count values past (the study's)"
    )
    parser.add_argument("--json", help="also write the counts here: {file: {method or variant: counts}}")
    args = parser.parse_args()
    written: dict[str, dict] = {}
    tokenizers = {}  # the study's backbone's, which cut its results
    for path in args.files:
        for label, config, samples in answered(read_result(path), args.data_dir):
            if config.backbone not in tokenizers:
                tokenizers[config.backbone] = load_backbone(config.backbone).tokenizer
            examples, trained, reordered = study_data(config)
            counted = summary(samples, examples, trained, reordered, tokenizers[config.backbone], args.result_tokens)
            print(f"{path} {label}: {json.dumps(counted)}")
            written.setdefault(path, {})[label] = counted
    if args.json:
        write_json_atomic(args.json, written)


if __name__ == "__main__":
    main()
