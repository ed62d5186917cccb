"""The compositional study on real data: ComplexFuncBench's tools to evaluate, held-out tools to adapt.

ComplexFuncBench (NESTFUL format, 38 Booking.com tools, 2–11 calls a query) gives the evaluation procedures.
The adaptation phase's come from ``adapt_data``, some of: ``bfcl``, BFCL v4's multi-turn conversations
(file-system, trading, travel… tools, disjoint from Booking.com's; no execution results); ``bfcl-executed``, the
same turns with each call run on BFCL's simulated backends (`tokmem.data.bfcl_backends`: each step carries its
result, the target's format on tools disjoint from it); ``flights``,
ComplexFuncBench's own records over its flight tools (`FLIGHT_TOOLS`, with their recorded results, so the backbone
learns to read a result and copy values out of it); then every record that calls a flight tool is held out of the
evaluation, so the two sides still share no tool; ``chains`` (the default), synthetic records over 12 tools of their
own whose later calls read earlier results (`tokmem.data.tool_chains`); and ``study``, the study's own training
records, a diagnostic upper bound of adapting in the target's format (it shares every tool with the evaluation).
Both files are those of ``shared/data/function-calling`` (see its README), found in ``--data-dir`` or the shared
data folder (`tokmem.data.shared`).

Records are split three ways by a stable hash of the query (md5 read as a fraction in [0, 1): ``query_hash``), so a
record's side never depends on the seed, the order of the file or the other records (``three_way_split``): below
``test_fraction`` (0.2) the test split, read once; from there to ``test_fraction + dev_fraction`` (0.38) the
development split, where every choice is made; the rest the training pool.  Neither held-out split is ever trained
on, whatever the split answered (``split``: dev or test) and the seed.  The split answered is every record of it that
the loop can score: with ``results`` (the default), each step carries its call's recorded response, references to
earlier results are resolved to their values (``tokmem.data.nestful.resolve_references``), and a held-out record must
call only tools that training-pool records call (TokMem lays out a record's gold earlier calls by their tools' memory
tokens); the others are left out and counted.  Each seed trains on ``train_size`` records of the pool, a seeded
sample that calls every tool of both held-out splits (``covering_sample``), so every seed answers the same records and
a bank trained at one seed can answer either split.  ``test_data`` replaces the test split with a file of the same
format (its spec given by ``test_spec`` or found beside it): a user's own split of ComplexFuncBench, whose records all
test, or any NESTFUL file, whose records over tools ComplexFuncBench lacks are split by query hash in turn, their
training side joining the training records.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from tokmem.data.bfcl import import_bfcl
from tokmem.data.nestful import import_nestful
from tokmem.data.procedures import Example, Step, stable_hash
from tokmem.data.tool_chains import tool_chains
from tokmem.data.tool_datasets import ToolData
from tokmem.data.shared import SHARED_ENV, shared_data, where_shared_data
from tokmem.errors import DataError

CFB_DATA = Path("complexfuncbench/complexfuncbench-data.json.gz")
BFCL_MULTI_TURN = Path("bfcl/BFCL_v4_multi_turn_base.json")
# ComplexFuncBench's flight tools.  Among the records of at most 4 calls, 27 of 306 call one of them, and those call
# nothing else; over all lengths, 118 records call flight tools alone (3–7 calls each).
FLIGHT_TOOLS = frozenset(
    {
        "Search_Flight_Location",
        "Search_Flights",
        "Search_Flights_Multi_Stops",
        "Get_Flight_Details",
        "Get_Min_Price",
        "Get_Min_Price_Multi_Stops",
        "Get_Seat_Map",
    }
)
ADAPT_SOURCE_NAMES = {
    "bfcl": "BFCL v4 multi-turn",
    "bfcl-executed": "BFCL v4 multi-turn, each call run on BFCL's backends (its result in context)",
    "flights": "ComplexFuncBench's flight tools (held out)",
    "chains": "synthetic tool chains whose later calls read earlier results (tokmem.data.tool_chains)",
    "study": "the study's own training records (a diagnostic: the evaluation's tools)",
}
ADAPT_SOURCES = tuple(ADAPT_SOURCE_NAMES)
# the default: synthetic, so it needs no data file and never shrinks the evaluation, and in the target's format
# (adapted on 120 of them, the 0.5B scored 28 and 27 exact steps of 80 on seeds 0-1 against 9 and 7 without
# adapting; on BFCL's turns, the default before, a few points above none: research/docs/studies.md "Causes, one A/B each")
ADAPT_DATA = ("chains",)
SPLITS = ("dev", "test")  # the held-out splits a run answers: choices are made on dev, the test is read once
# of all records by query hash, after the test's 0.2: 52 of the 306 records of at most 4 calls, 51 of them scorable
DEV_FRACTION = 0.18


def function_calling_dir(explicit: str | None = None) -> Path:
    """The folder holding ``complexfuncbench/`` and ``bfcl/``: ``explicit``, or the shared data's
    ``function-calling`` (`tokmem.data.shared`)."""
    folder = Path(explicit) if explicit else shared_data("function-calling")
    where = "--data-dir" if explicit else where_shared_data()
    for needed in (CFB_DATA, BFCL_MULTI_TURN):
        if not (folder / needed).is_file():
            raise DataError(
                f"{folder / needed} not found ({where}): the folder must hold {CFB_DATA} and "
                f"{BFCL_MULTI_TURN}; pass --data-dir DIR or set ${SHARED_ENV} to the shared data folder"
            )
    return folder


def check_adapt_data(adapt_data: tuple[str, ...]) -> None:
    """Refuse adaptation data other than some of `ADAPT_SOURCES`."""
    if not adapt_data or not set(adapt_data) <= set(ADAPT_SOURCES):
        raise DataError(f"adaptation data '{','.join(adapt_data)}': choose from {', '.join(ADAPT_SOURCES)}")
    if {"bfcl", "bfcl-executed"} <= set(adapt_data):
        raise DataError(
            "adaptation data: bfcl and bfcl-executed are the same turns, without and with results: pick one"
        )


def query_hash(query: str) -> float:
    """A stable number in [0, 1) for a query: its md5 read as a fraction."""
    return stable_hash(query) / 16**32


def hash_split(examples: list[Example], test_fraction: float) -> tuple[list[Example], list[Example]]:
    """(train, test): a query is a test query when its hash is below ``test_fraction``; both in hash order."""
    ranked = sorted((query_hash(e.query), k) for k, e in enumerate(examples))
    test = [examples[k] for h, k in ranked if h < test_fraction]
    return [examples[k] for h, k in ranked if h >= test_fraction], test


def three_way_split(
    examples: list[Example], test_fraction: float, dev_fraction: float
) -> tuple[list[Example], list[Example], list[Example]]:
    """(train, dev, test) by query hash (``query_hash``): test below ``test_fraction``, dev from there to
    ``test_fraction + dev_fraction``, train the rest; each in hash order."""
    rest, test = hash_split(examples, test_fraction)
    train, dev = hash_split(rest, test_fraction + dev_fraction)
    return train, dev, test


def covering_sample(pool: list[Example], size: int, tools: set[str], rng: random.Random) -> list[Example]:
    """``size`` records of ``pool`` drawn with ``rng`` that call every one of ``tools`` the pool calls: first, for
    each such tool (by name) that no record drawn so far calls, a record calling it; then a sample of the rest.  A plain
    sample may miss a rare tool, and the records calling it could not be answered at that seed."""
    chosen: list[Example] = []
    for tool in sorted(tools):
        callers = [e for e in pool if tool in e.procedures and e not in chosen]
        if callers and not any(tool in e.procedures for e in chosen):
            chosen.append(rng.choice(callers))
    if len(chosen) > size:
        raise DataError(
            f"{size} training records cannot call every tool the held-out records call ({len(chosen)} records "
            "needed): raise --train-multi"
        )
    return chosen + rng.sample([e for e in pool if e not in chosen], size - len(chosen))


@dataclass
class RealData:
    """The study's data, the adaptation examples (with how many came from each source) and what was left out of
    them, by reason (for the result file)."""

    data: ToolData
    adaptation: list[Example]
    left_out: Counter = field(default_factory=Counter)
    adaptation_sources: dict[str, int] = field(default_factory=dict)
    splits: dict[str, dict] = field(default_factory=dict)  # records and steps of the training pool, dev and test

    def with_named_results(self) -> "RealData":
        """Every tool result opened with its tool's name (``named_result``), in training, testing and adapting."""
        data = replace(self.data, train=_named(self.data.train), test=_named(self.data.test))
        return replace(self, data=data, adaptation=_named(self.adaptation))

    def summary(self) -> dict:
        return {
            "left_out": dict(self.left_out),
            "train_calls": dict(sorted(Counter(len(e.steps) for e in self.data.train).items())),
            "adaptation": self.adaptation_sources,
            "splits": self.splits,
        }


def _scorable(records: list[Example], known: set[str], results: bool) -> list[Example]:
    """With ``results``, the records whose every tool is ``known`` (a training record calls it: the loop lays out a
    record's gold earlier calls by their tools' memory tokens); without, all."""
    return [e for e in records if known.issuperset(e.procedures)] if results else records


def named_result(step: Step) -> Step:
    """The step with its result opened by its tool's name (``[Search_Hotels] {...}``): a memory token hides the name
    of the call it stands for from what is read after it; the result turn says it in words."""
    return step if step.result is None else replace(step, result=f"[{step.procedure}] {step.result}")


def _named(examples: list[Example]) -> list[Example]:
    return [replace(e, steps=tuple(map(named_result, e.steps))) for e in examples]


def complexfuncbench_data(
    folder: Path,
    max_calls: int = 4,
    test_fraction: float = 0.2,
    train_size: int | None = None,
    test_size: int | None = None,
    adapt_samples: int = 5000,
    test_data: str | None = None,
    seed: int = 0,
    results: bool = True,
    test_spec: str | None = None,
    adapt_data: tuple[str, ...] = ADAPT_DATA,
    split: str = "dev",
    dev_fraction: float = DEV_FRACTION,
) -> RealData:
    """ComplexFuncBench's records with at most ``max_calls`` calls, split three ways (the module docstring;
    ``test_data`` in place of the test split): at most ``train_size`` training records (a seeded ``covering_sample``)
    and the first ``test_size`` records of ``split`` in hash order (a test run answers them all).  The adaptation
    examples of ``adapt_data``: up to ``adapt_samples`` BFCL multi-turn turns with at most ``max_calls`` calls (``bfcl``;
    ``bfcl-executed``: each call with its result), every record over the flight tools alone (``flights``; records
    calling a flight tool are then left out of the evaluation), and the training records themselves (``study``: a
    diagnostic upper bound of adapting in the target's own format, not a held-out adaptation — it shares every tool
    with the evaluation)."""
    check_adapt_data(adapt_data)
    if split not in SPLITS:
        raise DataError(f"unknown split '{split}': choose from {', '.join(SPLITS)}")
    held = FLIGHT_TOOLS if "flights" in adapt_data else frozenset()
    left_out: Counter = Counter()
    imported = import_nestful(folder / CFB_DATA, results=results)
    records = _apart(_at_most(imported.examples, max_calls, left_out, "ComplexFuncBench"), held, left_out)
    pool, dev, test = three_way_split(records, test_fraction, dev_fraction)
    own_train: list[Example] = []  # records of test_data that train (their tools are ComplexFuncBench's strangers)
    catalog = imported.catalog
    if test_data:
        test_import = import_nestful(test_data, test_spec, results=results)
        mine = _apart(_at_most(test_import.examples, max_calls, left_out, str(test_data)), held, left_out)
        catalog = {**test_import.catalog, **imported.catalog}
        test, own_train = _own_split(mine, {p for e in pool for p in e.procedures}, test_fraction)
    known = {p for e in pool + own_train for p in e.procedures}
    splits = {"dev": dev, "test": test}
    held_out = {name: _scorable(part, known, results) for name, part in splits.items()}
    answered = _answered(split, splits[split], held_out[split], test_size, left_out)
    needed = {p for part in held_out.values() for e in part[:test_size] for p in e.procedures}
    train = _training(pool, train_size, needed, seed, left_out) + own_train
    if not train or not answered:
        why = "; ".join(f"{n} {reason}" for reason, n in left_out.items()) or "none"
        raise DataError(
            f"{test_data or folder / CFB_DATA}: {len(train)} training and {len(answered)} {split} records with at "
            f"most {max_calls} calls: both must be non-empty (raise --max-calls or --test-fraction); left out: {why}"
        )
    tools = list(dict.fromkeys(p for e in train + answered for p in e.procedures))
    rng = random.Random(seed)  # the adaptation's own: the same whatever the split and training sample
    adaptation = _adaptation(
        adapt_data, folder, max_calls, adapt_samples, imported.examples, train, tools, rng, left_out
    )
    return RealData(
        ToolData(train, answered, {name: catalog[name] for name in tools}),
        [e for examples in adaptation.values() for e in examples],
        left_out,
        {source: len(examples) for source, examples in adaptation.items()},
        {name: _counts(part) for name, part in (("train", pool + own_train), *held_out.items())},
    )


def _answered(
    split: str, records: list[Example], scorable: list[Example], size: int | None, left_out: Counter
) -> list[Example]:
    """The first ``size`` of the split's ``scorable`` records (a test run answers them all); what is left out counted."""
    if len(scorable) < len(records):
        left_out[f"{split} records calling a tool no training record calls"] += len(records) - len(scorable)
    if size is not None and size < len(scorable):
        if split == "test":
            raise DataError(
                f"a test run answers every one of the {len(scorable)} test records: leave --test-multi unset"
            )
        left_out[f"{split} records beyond {size}"] += len(scorable) - size
    return scorable[:size]


def _training(pool: list[Example], size: int | None, needed: set[str], seed: int, left_out: Counter) -> list[Example]:
    """The seed's ``size`` training records of the ``pool`` (all when None), calling every ``needed`` tool."""
    if size is None or size >= len(pool):
        return pool
    left_out[f"training records beyond {size}"] += len(pool) - size
    return covering_sample(pool, size, needed, random.Random(f"{seed}:train"))


def _counts(records: list[Example]) -> dict[str, int]:
    return {"records": len(records), "steps": sum(len(e.steps) for e in records)}


def _adaptation(
    adapt_data: tuple[str, ...],
    folder: Path,
    max_calls: int,
    samples: int,
    records: list[Example],
    train: list[Example],
    tools: list[str],
    rng: random.Random,
    left_out: Counter,
) -> dict[str, list[Example]]:
    """Each source of ``adapt_data``'s examples, in `ADAPT_SOURCES` order (the seeded sample of BFCL turns first)."""
    sources = {
        "bfcl": lambda: _bfcl_turns(folder, max_calls, samples, rng, left_out),
        "bfcl-executed": lambda: _bfcl_turns(folder, max_calls, samples, rng, left_out, executed=True),
        "flights": lambda: [e for e in records if FLIGHT_TOOLS.issuperset(e.procedures)],
        "chains": lambda: tool_chains(samples, rng.randrange(2**32)),
        "study": lambda: list(train),
    }
    chosen = {source: sources[source]() for source in ADAPT_SOURCES if source in adapt_data}
    for source, examples in chosen.items():
        shared = {p for e in examples for p in e.procedures} & set(tools)
        if shared and source != "study":
            raise DataError(
                f"adaptation data '{source}' ({ADAPT_SOURCE_NAMES[source]}): its tools must be disjoint from the "
                f"evaluation's, but both have {', '.join(sorted(shared))}; adapt on another source (--adapt-data "
                f"{'|'.join(name for name in ADAPT_SOURCES if name != source)})"
            )
    return chosen


def _own_split(records: list[Example], known: set[str], test_fraction: float) -> tuple[list, list]:
    """(test, train) of a user's test file: every record over tools ComplexFuncBench's training records call is a
    test record; the others (a file of other tools: any NESTFUL file) are split by query hash as ComplexFuncBench is,
    their training side joining the training records so that their tools get memory tokens."""
    covered = [e for e in records if known.issuperset(e.procedures)]
    to_train, to_test = hash_split([e for e in records if not known.issuperset(e.procedures)], test_fraction)
    return covered + to_test, to_train


def _apart(examples: list[Example], held: frozenset[str], left_out: Counter) -> list[Example]:
    """The records that call none of the ``held`` tools (those the adaptation phase trains on)."""
    kept = [e for e in examples if held.isdisjoint(e.procedures)]
    if len(kept) < len(examples):
        left_out["records calling a flight tool (held out to adapt)"] += len(examples) - len(kept)
    return kept


def _at_most(examples: list[Example], max_calls: int, left_out: Counter, source: str) -> list[Example]:
    kept = [e for e in examples if len(e.steps) <= max_calls]
    if len(kept) < len(examples):
        left_out[f"{source} records with more than {max_calls} calls"] += len(examples) - len(kept)
    return kept


def _bfcl_turns(
    folder: Path,
    max_calls: int,
    samples: int,
    rng: random.Random,
    left_out: Counter,
    executed: bool = False,
) -> list[Example]:
    """BFCL multi-turn turns (each a query and its calls; ``executed``: each call with its result) with at most
    ``max_calls`` calls, ``samples`` of them."""
    turns = import_bfcl(folder / BFCL_MULTI_TURN, execute=executed).examples
    turns = _at_most(turns, max_calls, left_out, "BFCL multi-turn")
    if samples < len(turns):
        left_out[f"BFCL multi-turn turns beyond {samples}"] += len(turns) - samples
        turns = rng.sample(turns, samples)
    return turns
