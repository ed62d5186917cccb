"""The travel example's committed files (examples/travel/: catalog, training and held-out examples) are what its
script writes, and its held-out set stays apart from its training set: no held-out query is a training query (a fair
test of unseen phrasings)."""

import json
import random

from helpers import TRAVEL, travel_script

make_data = travel_script("make_data")


def committed(name: str) -> list[dict]:
    return [json.loads(line) for line in (TRAVEL / name).read_text(encoding="utf-8").splitlines()]


def test_the_committed_travel_data_is_what_make_data_writes_with_its_default_seed():
    assert json.loads((TRAVEL / "catalog.json").read_text(encoding="utf-8")) == make_data.CATALOG
    assert committed("train.jsonl") == make_data.examples(random.Random(0), 160, "train")
    assert committed("heldout.jsonl") == make_data.heldout(random.Random(1))


def test_no_held_out_travel_query_is_a_training_query():
    training = {example["query"].casefold() for example in committed("train.jsonl")}
    held_out = [example["query"] for example in committed("heldout.jsonl")]
    assert len(held_out) == 40 and not [query for query in held_out if query.casefold() in training]
