"""The open set: how many off-topic queries a bank leaves to the plain backbone.

TokMem's open-set rule answers a query with the plain backbone when the memory mass at the routing position is below
the threshold.  In-domain scores count such a fallback as a miss; this counts the other side, the queries no
procedure fits, where routing is the miss: a bank that adds skills must not take over the model.  The same rule as
decoding (``tokmem.decoding.decode.route``'s memory mass against ``open_set_threshold``), so the count is what
``tokmem run``, ``tokmem.chat`` and ``tokmem serve`` do with ``tool_choice="auto"``.
"""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

from tokmem.data.off_topic import bank_words, mentions, off_topic_set, read_queries
from tokmem.decoding.decode import open_set_threshold, route
from tokmem.model import TokMemModel

SHOWN = 5  # routed queries listed in a result


def restraint(model: TokMemModel, queries: list[str], threshold: float | None = None) -> dict:
    """Of ``queries`` (off-topic), how many the bank answers in words (memory mass below ``threshold``).  Queries
    that share a word with a procedure's name or description (``off_topic.mentions``) may well be the bank's: they
    are counted apart (``about_the_bank``) and not scored.  ``masses``: each scored query's memory mass (a threshold
    curve's off-topic side)."""
    threshold = open_set_threshold(model.bank, threshold)
    words = bank_words(model.bank.names, model.bank.descriptions)
    scored = [q for q in queries if not mentions(q, words)]
    routes = route(model, scored, k=1) if scored else []
    routed = [r for r in routes if r.memory_mass >= threshold]
    return {
        "queries": len(queries),
        "about_the_bank": len(queries) - len(scored),
        "scored": len(scored),
        "answered_in_words": len(scored) - len(routed),
        "restraint": (len(scored) - len(routed)) / len(scored) if scored else None,
        "threshold": threshold,
        "routed": [
            {"query": r.query, "procedure": r.candidates[0][0], "memory_mass": round(r.memory_mass, 4)}
            for r in routed[:SHOWN]
        ],
        "masses": [round(r.memory_mass, 4) for r in routes],
    }


def off_topic_queries(spec: str) -> list[str]:
    """A user's file (``off_topic.read_queries``) or a built-in set by name (``off_topic.OFF_TOPIC_SETS``)."""
    return read_queries(spec) if Path(spec).is_file() else off_topic_set(spec)


def default_sets() -> list[str]:
    """The built-in sets ``tokmem train`` and ``eval`` report: the general-chat prompts, and BFCL's irrelevance
    questions where the ``bfcl-eval`` wheel is installed."""
    return ["chat", "bfcl-irrelevance"] if find_spec("bfcl_eval") else ["chat"]


def restraints(model: TokMemModel, specs: list[str], threshold: float | None = None) -> dict:
    """``restraint`` on each set of ``specs`` (names or files), by spec."""
    return {spec: restraint(model, off_topic_queries(spec), threshold) for spec in specs}
