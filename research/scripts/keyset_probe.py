"""Whether a call's key set can be read off the backbone's state where its tool is routed: a linear probe.

The rows of a tool-loop bank add or leave out a tool's optional keys by habit (``sortBy`` on every
``Search_Attractions`` call), where LoRA reads the query; four training levers aimed at that choice left it where it
was (research/docs/studies.md, "Causes").  The routing side refit (``tokmem.refit``) showed that output rows fitted to the frozen
states before each memory token route the tools as well as LoRA.  If the key set were as legible in those states,
the choice could move there: a memory row a (tool, key set), routed and refit as tools are, the grammar then bound to
that key set.  This measures that before building it, without training: the kept bank reads the study's
training and test records once (``tokmem.refit.routing_states``' layout, gold calls and results before each call),
and for each tool a multinomial logistic regression (scikit-learn, standardised states) is fitted on its training
calls' states to their key sets, then asked for each test call of that tool.  Beside it: the tool's most frequent
training key set (the habit), and the key sets the bank itself and another method decoded at those steps (their
result files' samples, where they chose the right tool).  Two states: before the memory token (where a key-set row
would be routed: ``tokmem.refit.routing_states``' state, read here beside the next one) and at it (where the row's
arguments begin).  ``--answer`` then answers each test step as the study does, its arguments bound to the key set
the probe reads off the state before its memory token.

    OMP_NUM_THREADS=2 python -m research.scripts.keyset_probe results/tails-qwen0.5b-s1-banks/shared1-refit.safetensors \
        --seed 1 --answers results/tails-qwen0.5b-s1.json:shared1-refit \
        --answers results/loop-cfb-qwen0.5b-seeds-runs/epochs2-seed1.json:lora --json results/keyset-probe-qwen0.5b-s1.json
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import torch
from research.scripts.paired_steps import answers
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from tqdm.auto import tqdm

import tokmem
from tokmem.eval import metrics
from tokmem.eval.tool_loop import chat_answerer, loop_scores
from tokmem.io import write_json_atomic
from tokmem.report import machine
from tokmem.training.sequences import RESULT_TOKENS, collate, to_device
from research.studies.compositional_config import make_config
from research.studies.harness import progress_bar
from research.studies.tool_setup import tool_data
from tokmem.training.train import encode_examples

BOUND = "key sets probed, bound"  # the answers with each step's arguments bound to the probe's key set
PLACES = ("before", "at")  # the state before the memory token (routing), and at it (the arguments' start)


@torch.no_grad()
def call_states(model, encoded, batch_size: int) -> dict[str, torch.Tensor]:
    """Each call's states (calls of record after record, in order): before its memory token and at it."""
    pad, steer = model.backbone.tokenizer.pad_token_id, model.memory_matrices()[1]
    found = {place: [] for place in PLACES}
    for start in tqdm(range(0, len(encoded), batch_size), desc="states", unit="batch"):
        batch = to_device(collate(encoded[start : start + batch_size], pad), model.device)
        hidden, _ = model.hidden(batch["input_ids"], batch["attention_mask"], steer=steer)
        where = batch["labels"][:, 1:] >= model.vocab_size
        found["before"].append(hidden[:, :-1][where].float().cpu())
        found["at"].append(hidden[:, 1:][where].float().cpu())
    return {place: torch.cat(states) for place, states in found.items()}


def key_set(call: tuple | None) -> frozenset | None:
    """The keys of a parsed call (``metrics.parse_call``'s ``(name, arguments)``), None for no call."""
    return None if call is None else frozenset(key for key, _ in call[1])


def gold_calls(examples) -> list[tuple[str, frozenset]]:
    """(tool, key set) of each call of ``examples``, in ``call_states``' order."""
    calls = metrics.gold_calls(step.response for example in examples for step in example.steps)
    return [(call[0], key_set(call)) for call in calls]


def decoded_key_sets(spec: str, examples) -> list[frozenset | None]:
    """The key set a result file's method decoded at each test call (None where it chose another tool or no JSON
    call), in ``gold_calls``' order."""
    by_query = {sample["query"]: sample["step"] for sample in answers(spec)}
    decoded = []
    for example in examples:
        steps = by_query[example.query]
        for k, step in enumerate(example.steps):
            call = metrics.parse_call(steps[k]) if k < len(steps) and steps[k] is not None else None
            decoded.append(key_set(call) if call and call[0] == step.procedure else None)
    return decoded


class KeySetProbe:
    """Per tool, a multinomial logistic regression from a state to the tool's training key sets (standardised
    states); a tool with one training key set (or none) predicts that one (the empty set)."""

    def __init__(self, states: torch.Tensor, calls: list[tuple[str, frozenset]]):
        self.fitted = {}
        for tool in {tool for tool, _ in calls}:
            rows = [i for i, (name, _) in enumerate(calls) if name == tool]
            key_sets = sorted({calls[i][1] for i in rows}, key=sorted)
            if len(key_sets) == 1:
                self.fitted[tool] = key_sets[0]
                continue
            classifier = make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000))
            labels = [key_sets.index(calls[i][1]) for i in rows]
            self.fitted[tool] = (classifier.fit(states[rows].numpy(), labels), key_sets)

    def predict(self, tool: str, state: torch.Tensor) -> frozenset:
        fitted = self.fitted.get(tool, frozenset())
        if isinstance(fitted, frozenset):
            return fitted
        classifier, key_sets = fitted
        return key_sets[int(classifier.predict(state.numpy()[None])[0])]

    def predict_all(self, states: torch.Tensor, calls: list[tuple[str, frozenset]]) -> list[frozenset]:
        """Each call's key set as its tool's probe reads it off its state."""
        return [self.predict(tool, state) for state, (tool, _) in zip(states, calls)]


def bound_tool(name: str, schema: dict, keys: frozenset) -> dict:
    """An OpenAI tool object whose ``parameters`` bind ``name``'s arguments to exactly ``keys`` (each required, no
    other), over the bank's ``schema`` of it (``tokmem.chat.tool_schemas`` orders them as the tool learned)."""
    properties = {key: spec for key, spec in schema["properties"].items() if key in keys}
    parameters = {"type": "object", "properties": properties, "required": list(properties)}
    return {"type": "function", "function": {"name": name, "parameters": {**parameters, "additionalProperties": False}}}


def probe_answerer(model, config, fitted: KeySetProbe, states: torch.Tensor, examples) -> callable:
    """The study's answers (``chat_answerer``) with each tool's arguments bound to the key set ``fitted`` reads off
    the step's state before its memory token (``states``: ``call_states``' of ``examples``, gold calls before each:
    the per-step layout), whichever tool the memory token then picks; one conversation at a time (each step has its
    own schemas)."""
    first, start = {}, 0  # each record's first call's place in ``states``
    for example in examples:
        first[example.query], start = start, start + len(example.steps)

    def answer(due, histories, caches, choice):
        calls, read = [], 0
        for example, history, cache in zip(due, histories, caches):
            state = states[first[example.query] + len(history)]
            tools = [bound_tool(n, s, fitted.predict(n, state)) for n, s in model.bank.tool_schemas().items()]
            (call,), tokens = chat_answerer(model, config, RESULT_TOKENS, tools=tools)(
                [example], [history], [cache], choice
            )
            calls.append(call)
            read += tokens
        return calls, read

    return answer


def habit(train_calls, test_calls) -> list[frozenset]:
    """Each test call's tool's most frequent training key set."""
    counts = {}
    for tool, keys in train_calls:
        counts.setdefault(tool, Counter())[keys] += 1
    return [counts[tool].most_common(1)[0][0] if tool in counts else frozenset() for tool, _ in test_calls]


def right(predicted, test_calls, among) -> str:
    """How many predicted key sets equal the gold ones, of the calls ``among`` marks (a decoded None: wrong)."""
    hits = sum(p == keys for p, (_, keys), keep in zip(predicted, test_calls, among) if keep)
    return f"{hits} of {sum(among)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bank")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--answers", action="append", default=[], metavar="FILE:NAME", help="decoded key sets beside")
    parser.add_argument("--json", required=True)
    parser.add_argument("--states", metavar="PT", help="keep the states read here (read them here when it exists)")
    parser.add_argument(
        "--answer", action="store_true", help="answer the test records per step with the probe's key sets bound"
    )
    args = parser.parse_args()
    model = tokmem.load(args.bank, device="cpu")
    config = make_config("cpu", dataset="complexfuncbench", backbone=model.backbone.name.split("+")[0], seed=args.seed)
    data = tool_data(config, (1, config.tools))
    calls = {split: gold_calls(examples) for split, examples in (("train", data.train), ("test", data.test))}
    if args.states and Path(args.states).is_file():
        states = torch.load(args.states)
    else:
        states = {
            split: call_states(model, encode_examples(model, examples, config.train()), config.batch_size)
            for split, examples in (("train", data.train), ("test", data.test))
        }
        if args.states:
            torch.save(states, args.states)
    for split in calls:  # a call cut off by max_length has no state: the two lists would not line up
        if len(calls[split]) != len(states[split]["before"]):
            raise SystemExit(f"{split}: {len(calls[split])} calls but {len(states[split]['before'])} states")
    test = calls["test"]
    several = [len({keys for tool, keys in calls["train"] if tool == name}) > 1 for name, _ in test]
    predicted = {"habit (the tool's most frequent training key set)": habit(calls["train"], test)}
    probes = {place: KeySetProbe(states["train"][place], calls["train"]) for place in PLACES}
    for place, fitted in probes.items():
        predicted[f"probe on the state {place} the memory token"] = fitted.predict_all(states["test"][place], test)
    subsets = {"all test calls": [True] * len(test)}
    for spec in args.answers:
        decoded = decoded_key_sets(spec, data.test)
        predicted[f"{spec} as decoded"] = decoded
        subsets[f"where {spec} chose the right tool"] = [d is not None for d in decoded]
    result = {"bank": args.bank, "seed": args.seed, "machine": machine(), "key set right": {}}
    for label, among in subsets.items():
        for tools, keep in (
            ("", among),
            (", tools with several training key sets", [a and s for a, s in zip(among, several)]),
        ):
            result["key set right"][label + tools] = {name: right(keys, test, keep) for name, keys in predicted.items()}
    write_json_atomic(args.json, result)  # the probe's counts before the longer answering
    print(json.dumps(result, indent=1))
    if args.answer:
        answer = probe_answerer(
            model, replace(config.decode(), threshold=0.0), probes["before"], states["test"]["before"], data.test
        )
        bar = progress_bar(True)
        scores = loop_scores(answer, data.test, config.max_calls, bar, "key sets probed", True, end_to_end=False)
        bar.close()
        result["rules"] = {BOUND: scores}  # as reanswer_loop.py keeps a rule's answers (paired_steps.py reads them)
        step = scores["step"]
        print(f"answered: exact steps {step['exact_steps']['all']} of {step['steps']['all']}; {scores['outcomes']}")
        write_json_atomic(args.json, result)


if __name__ == "__main__":
    main()
