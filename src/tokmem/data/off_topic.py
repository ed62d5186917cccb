"""Off-topic queries: what a bank must leave to the plain backbone (the open set).

Two uses, from two sources kept apart:

- **Training negatives** (``negatives``): queries generated from the frames and fillers of ``off_topic.json``
  (requests for other skills and tools, questions, chat), each trained to answer in words, no memory token
  (``Example`` with no steps).
- **Evaluation** (``OFF_TOPIC_SETS``): the general-chat prompts of the same file, written apart from the frames, and
  BFCL's irrelevance questions (``BFCL_v4_irrelevance.json``, 240; ``BFCL_v4_live_irrelevance.json``, 884), read from
  the ``bfcl-eval`` wheel when it is installed (``pip install --no-deps bfcl-eval``); or a user's own file
  (``read_queries``).

A query that shares a word with a procedure's name or description (``bank_words``, ``mentions``) is not off-topic
for that bank ("Convert 5 miles to km" for ``convert_currency``): such negatives are dropped before training, and such
evaluation queries are counted apart.  Words are compared whole, plural and ``-ing``/``-ed`` endings folded
("flights"/"flight", "cities"/"city"), so "current time" does not meet "currency".

**Near misses** (``near_misses``) are the exception, made on purpose: queries that name a bank's own words but ask
for none of its procedures ("Tell me a joke about the word 'currency'."), from the ``near_frames`` of the same file;
``TrainConfig.near_misses`` makes up to half the negatives of them.
"""

from __future__ import annotations

import json
import random
import re
from functools import cache
from importlib import resources
from pathlib import Path

from tokmem.data.procedures import Example
from tokmem.errors import DataError, TokMemError
from tokmem.io import read_jsonl, read_text

BFCL_SETS = {"bfcl-irrelevance": "BFCL_v4_irrelevance.json", "bfcl-live-irrelevance": "BFCL_v4_live_irrelevance.json"}
OFF_TOPIC_SETS = ("chat", *BFCL_SETS)  # the built-in evaluation sets, by name
BFCL_INSTALL = "pip install --no-deps bfcl-eval==2026.3.23"
DRAWS = 4  # queries drawn a frame, per filler of its longest slot (repeats dropped)
COMMON = frozenset(
    "about above after again also another their there these those which where while would could should "
    "given other from into with your what when this that have will them then than some such each make made "
    "name names number value values given using used string list object function returns return current".split()
)
SLOT = re.compile(r"\{(\w+)\}")


@cache
def _texts() -> dict:
    return json.loads(resources.files("tokmem.data").joinpath("off_topic.json").read_text())


def chat_prompts() -> list[str]:
    """The built-in general-chat prompts (an evaluation set, never trained on)."""
    return list(_texts()["chat"])


def generated(seed: int) -> list[str]:
    """Every query the frames make with fillers drawn by ``seed`` (one query a frame and filler choice, in a seeded
    order, no repeats): the training negatives' pool."""
    texts, rng = _texts(), random.Random(seed)
    pool = []
    for frame in texts["frames"]:
        slots = SLOT.findall(frame)
        for _ in range(DRAWS * max(len(texts["fillers"][slot]) for slot in slots) if slots else 1):
            pool.append(SLOT.sub(lambda m: rng.choice(texts["fillers"][m.group(1)]), frame))
    pool = list(dict.fromkeys(pool))
    rng.shuffle(pool)
    return pool


def negatives(count: int, seed: int, names=(), descriptions=(), near: bool = False) -> list[Example]:
    """``count`` training negatives (fewer if the pool runs out) for a bank of procedures ``names`` described by
    ``descriptions``: generated queries that mention none of the bank's words (``bank_words``), and with ``near``,
    up to half of them near misses (``near_misses``); each an example with no steps (the backbone answers)."""
    words = bank_words(names, descriptions)
    close = near_misses(names, descriptions, seed)[: count // 2] if near else []
    queries = close + [q for q in generated(seed) if not mentions(q, words)][: count - len(close)]
    return [Example(query=q, steps=(), id=f"off-topic-{k}") for k, q in enumerate(queries)]


def near_misses(names, descriptions=(), seed: int = 0) -> list[str]:
    """Queries that name the bank's own words but ask for none of its procedures, in a seeded order: each
    ``near_frames`` frame with each of the words; a frame that itself mentions the bank ("Tell me a joke about…" for a
    ``tell_joke`` tool) is skipped."""
    words, stems = _words(names, descriptions), bank_words(names, descriptions)
    frames = [f for f in _texts()["near_frames"] if not mentions(f, stems)]
    queries = list(dict.fromkeys(f.format(word=w.lower()) for f in frames for w in words))
    random.Random(f"near:{seed}").shuffle(queries)
    return queries


def _words(names, descriptions=()) -> list[str]:
    """The words of procedures' names and descriptions that say what they do (four letters or more, not a common
    word), in order, once each."""
    words = []
    for text in [*names, *descriptions]:
        spaced = re.sub(r"([a-z])([A-Z])", r"\1 \2", text or "").replace("_", " ").replace(".", " ")
        words += [w for w in re.findall(r"[A-Za-z]+", spaced) if len(w) >= 4 and w.lower() not in COMMON]
    return list(dict.fromkeys(w.lower() for w in words))


def bank_words(names, descriptions=()) -> frozenset[str]:
    """The stems of the words of procedures' names and descriptions that say what they do (``_words``): a query with
    one of them is about the bank's domain."""
    return frozenset(map(_stem, _words(names, descriptions)))


def mentions(query: str, words: frozenset[str]) -> bool:
    """Whether ``query`` has a word whose stem is one of ``words``."""
    return any(_stem(w) in words for w in re.findall(r"[A-Za-z]+", query) if len(w) >= 4)


def _stem(word: str) -> str:
    """The word lower-cased, a plural's or an ``-ing``/``-ed`` ending folded: "flights" → "flight", "cities" →
    "city", "booking" → "book"; whole otherwise ("current" and "currency" stay apart)."""
    word = word.lower()
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith("ing") and len(word) > 5:
        return word[:-3]
    if word.endswith("ed") and len(word) > 4:
        return word[:-2]
    if word.endswith("es") and word[:-2].endswith(("ch", "sh", "ss", "x")):
        return word[:-2]
    if word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def bfcl_questions(name: str) -> list[str]:
    """The user questions of a BFCL irrelevance set (``BFCL_SETS``), the first user turn of each entry."""
    try:
        data = resources.files("bfcl_eval").joinpath("data", BFCL_SETS[name])
        lines = data.read_text().splitlines()
    except ModuleNotFoundError:
        raise TokMemError(f"the off-topic set '{name}' is read from the bfcl-eval wheel: {BFCL_INSTALL}") from None
    questions = []
    for line in filter(str.strip, lines):
        turn = json.loads(line)["question"][0]
        questions.append(next(m["content"] for m in turn if m["role"] == "user"))
    return questions


def off_topic_set(name: str) -> list[str]:
    """A built-in evaluation set by name (``OFF_TOPIC_SETS``)."""
    if name == "chat":
        return chat_prompts()
    if name in BFCL_SETS:
        return bfcl_questions(name)
    raise TokMemError(f"off-topic set '{name}': no such file, nor a built-in set ({', '.join(OFF_TOPIC_SETS)})")


def read_queries(path) -> list[str]:
    """A user's off-topic queries: a ``.jsonl`` file of objects with a ``query`` (procedure examples with empty
    ``steps`` are such objects), or any other text file with one query a line."""
    path = Path(path)
    if path.suffix != ".jsonl":
        queries = [line.strip() for line in read_text(path).splitlines() if line.strip()]
    else:
        queries = []
        for number, obj in read_jsonl(path):
            query = obj.get("query") if isinstance(obj, dict) else None
            if not isinstance(query, str) or not query.strip():
                raise DataError(f"{path}:{number}: field 'query': missing or empty (must be a non-empty string)")
            queries.append(query)
    if not queries:
        raise DataError(f"{path}: no queries (the file is empty)")
    return queries
