"""Tool-calling study datasets: single-tool samples of each tool, and multi-tool queries composed from them.

A query that needs several calls is an Example with one ``Step(tool, call)`` per call.  Datasets are built the way
the paper builds them (see ``assemble``), from the built-in tools (``tokmem.data.tool_catalog``) or from an xLAM
file (``tokmem.data.xlam``).
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass, replace

from tokmem.data.phrasing import join_queries, join_repeats
from tokmem.data.procedures import Example
from tokmem.data.tool_catalog import Tool, catalog, resolve, split_tools
from tokmem.data.xlam import load_xlam, offered_schemas, rank_tools, single_tool_samples
from tokmem.errors import DataError

MAX_SAME_TOOL_CALLS = 3
SAME_TOOL_WEIGHTS = (15, 4, 1)  # how often a single-tool sample makes 1, 2 or 3 calls
DRAWS_PER_EXAMPLE = 20
ADAPTATION_SAMPLES = 5000  # the reference code's adaptation set


@dataclass(frozen=True)
class StudySizes:
    """How a tool-calling study is built (``assemble``); the defaults are the paper's."""

    per_tool: int = 50  # single-tool samples per tool
    train_multi: int = 5000  # composed training queries
    test_multi: int = 500  # composed test queries
    max_calls: int = 4
    train_max_calls: int | None = None  # default: max_calls
    test_fraction: float = 0.2  # of each tool's samples, held out for the test queries
    seed: int = 0


@dataclass
class ToolData:
    """A tool-calling study's data: ``train`` (single-tool samples and composed queries), ``test``
    (composed queries of 2..max_calls calls over held-out samples), and the tools' schemas."""

    train: list[Example]
    test: list[Example]
    tools: dict[str, dict]

    def descriptions(self) -> dict[str, str]:
        return {name: schema.get("description", "") for name, schema in self.tools.items()}


def tool_examples(tools, n_single: int = 50, n_multi: int = 2500, max_calls: int = 4, seed: int = 0) -> list[Example]:
    """``n_single`` single-tool samples per tool (some calling it 2-3 times) plus up to ``n_multi`` queries
    composed of 2..``max_calls`` calls to different tools; no sample has more than ``max_calls`` calls.

    The shape of the paper's adaptation set (50 tools, 5,000 samples).
    """
    tools = resolve(tools)
    taken: set[str] = set()
    pools = sample_pools(tools, n_single, random.Random(f"{seed}:pools"), taken)
    singles = [e for pool in pools.values() for e in pool if len(e.steps) <= max_calls]
    return singles + compose(pools, n_multi, max_calls, random.Random(f"{seed}:multi"), taken, "multi")


def adaptation_examples(
    samples: int = ADAPTATION_SAMPLES,
    per_tool: int = StudySizes.per_tool,
    max_calls: int = StudySizes.max_calls,
    seed: int = StudySizes.seed,
) -> list[Example]:
    """The reference code's adaptation set over the built-in adaptation tools: ``per_tool`` single-tool samples
    of each (fewer when ``samples`` is too small for that), then composed queries up to ``samples`` in all."""
    tools = split_tools()[0]
    per_tool = min(per_tool, samples // len(tools))
    return tool_examples(tools, per_tool, samples - per_tool * len(tools), max_calls, seed)


def tool_dataset(tools=None, **sizes) -> ToolData:
    """Train/test data over built-in tools (default: the evaluation half), built as ``assemble`` describes;
    ``sizes``: `StudySizes` fields."""
    tools = resolve(split_tools()[1] if tools is None else tools)
    taken: set[str] = set()
    sizes = StudySizes(**sizes)
    pools = sample_pools(tools, sizes.per_tool, random.Random(f"{sizes.seed}:pools"), taken)
    return assemble(pools, catalog(tools), sizes)


def xlam_dataset(path, ranks: tuple[int, int] = (1, 50), **sizes) -> ToolData:
    """A study over the tools ranked ``ranks`` (1-based, inclusive) by single-tool frequency.

    Each tool keeps up to ``per_tool`` of its single-tool samples (distinct queries, drawn with
    ``seed``); train and test are built by ``assemble``; ``sizes``: `StudySizes` fields.
    """
    records = load_xlam(path)
    first, last = ranks
    ranking = rank_tools(records)
    if not 1 <= first <= last or last > len(ranking):
        raise DataError(f"{path}: cannot take tool ranks {first}..{last}: it has {len(ranking)} single-tool tools")
    chosen = [name for name, _ in ranking[first - 1 : last]]
    sizes = StudySizes(**sizes)
    pools = single_tool_samples(records, chosen, sizes.per_tool, random.Random(f"{sizes.seed}:xlam"))
    return assemble(pools, offered_schemas(records, chosen), sizes)


def sample_pools(tools: list[Tool], size: int, rng: random.Random, taken: set[str]) -> dict[str, list[Example]]:
    """``size`` single-tool samples per tool with queries not in ``taken`` (which grows)."""
    return {tool.name: unique(lambda: _single(tool, rng), size, taken, tool.name) for tool in tools}


def _single(tool: Tool, rng: random.Random) -> Example | None:
    """A query calling one tool once, or (sometimes) two or three times with different arguments."""
    count = rng.choices(range(1, MAX_SAME_TOOL_CALLS + 1), weights=SAME_TOOL_WEIGHTS)[0]
    queries, steps = zip(*(tool.draw(rng) for _ in range(count)))
    if len(set(steps)) < count:
        return None
    return Example(join_repeats(list(queries)), tuple(steps))


def assemble(pools, tools, sizes: StudySizes) -> ToolData:
    """The paper's construction of a tool-calling study from single-tool samples (``pools``: tool → samples).

    Each tool's samples are split into a training part and a held-out part (``sizes.test_fraction``).  The
    test set is up to ``test_multi`` queries composed from held-out samples, with 2..``max_calls`` calls;
    the training set is the training samples plus up to ``train_multi`` queries composed from them,
    every one with at most ``train_max_calls`` calls (default ``max_calls``; 1 means single calls only).
    No test query, nor any sample composed into one, is in training; and the test set does not depend on
    ``train_max_calls`` or ``train_multi``.
    """
    train_multi, test_multi, max_calls, seed = sizes.train_multi, sizes.test_multi, sizes.max_calls, sizes.seed
    train_cap = max_calls if sizes.train_max_calls is None else sizes.train_max_calls
    held_out, kept = _split_pools(pools, sizes.test_fraction, random.Random(f"{seed}:split"))
    taken = {e.query for pool in pools.values() for e in pool}
    test = compose(held_out, test_multi, max_calls, random.Random(f"{seed}:test"), taken, "multi-test")
    singles = [e for pool in kept.values() for e in pool if len(e.steps) <= train_cap]
    train = singles + compose(kept, train_multi, train_cap, random.Random(f"{seed}:train"), taken, "multi-train")
    return ToolData(train, test, dict(tools))


def _split_pools(pools, fraction, rng) -> tuple[dict, dict]:
    held_out, kept = {}, {}
    for name, pool in pools.items():
        pool = rng.sample(pool, len(pool))
        cut = round(len(pool) * fraction)
        held_out[name], kept[name] = pool[:cut], pool[cut:]
    return held_out, kept


def compose(pools, count: int, max_calls: int, rng: random.Random, taken: set[str], prefix: str) -> list[Example]:
    """Up to ``count`` new queries, each joining samples of 2 or more different tools into 2..``max_calls``
    calls (the number of calls drawn uniformly); fewer when the pools run out of new combinations."""
    ordered = {name: sorted(pool, key=lambda e: len(e.steps)) for name, pool in pools.items() if pool}
    if max_calls < 2 or len(ordered) < 2:
        return []
    sizes = {name: [len(e.steps) for e in pool] for name, pool in ordered.items()}
    return unique(lambda: _composite(ordered, sizes, max_calls, rng), count, taken, prefix)


def _composite(ordered, sizes, max_calls, rng) -> Example | None:
    target = rng.randint(2, max_calls)
    parts, calls = [], 0
    for name in rng.sample(sorted(ordered), len(ordered)):
        room = target - calls - (0 if parts else 1)  # the first sample leaves room for another tool
        fitting = bisect.bisect_right(sizes[name], room)
        if fitting:
            parts.append(ordered[name][rng.randrange(fitting)])
            calls += len(parts[-1].steps)
        if calls == target:
            return Example(join_queries([p.query for p in parts]), tuple(s for p in parts for s in p.steps))
    return None


def unique(draw, count: int, taken: set[str], prefix: str) -> list[Example]:
    """Up to ``count`` examples from ``draw()`` (which may give None) with queries not in ``taken`` (which
    grows), ids ``prefix-k``; gives up after ``DRAWS_PER_EXAMPLE`` draws per wanted example."""
    examples = []
    for _ in range(count * DRAWS_PER_EXAMPLE):
        if len(examples) == count:
            break
        example = draw()
        if example is not None and example.query not in taken:
            taken.add(example.query)
            examples.append(replace(example, id=f"{prefix}-{len(examples)}"))
    return examples
