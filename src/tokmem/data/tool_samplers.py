"""Argument samplers of the built-in tools (``tool_catalog.json``), by the names the catalog gives them.

A tool's ``"sample"`` in the catalog is either the name of a whole-tool sampler (``TOOL_SAMPLERS``: for tools
whose arguments depend on each other) or an object mapping each argument to a value spec ``[name, *args]``:
the value sampler ``VALUE_SAMPLERS[name]`` called as ``(rng, *args)``, e.g. ``["ints", 1, 50, [6, 10]]``, or one
of two combinators over specs:

* ``["either", p, first, second]``: ``first`` with probability ``p`` (one ``rng.random()``), else ``second``;
* ``["one_of", first, second, …]``: one of the specs, chosen with ``rng.choice``.

The arguments are drawn in the order the object lists them.  That order, and the order of the random calls
inside each sampler, fix the datasets made with a given seed: change either and every dataset changes.
"""

from __future__ import annotations

import datetime
import random
from typing import Any, Callable

from tokmem.data.builtin import WORDS
from tokmem.errors import DataError

ANAGRAMS = (
    ("listen", "silent"),
    ("earth", "heart"),
    ("night", "thing"),
    ("dusty", "study"),
    ("cider", "cried"),
    ("state", "taste"),
    ("below", "elbow"),
    ("angel", "glean"),
    ("inch", "chin"),
    ("peach", "cheap"),
)
DATE_FORMATS = ("%Y-%m-%d", "%d/%m/%Y", "%m-%d-%Y", "%B %d, %Y", "%d.%m.%Y")

# ---- values --------------------------------------------------------------------------------------------------


def _ints(rng, low, high, count=(5, 8)) -> list[int]:
    return [rng.randint(low, high) for _ in range(rng.randint(*count))]


def _floats(rng, low, high, count=(4, 7), digits=1) -> list[float]:
    return [round(rng.uniform(low, high), digits) + 0.0 for _ in range(rng.randint(*count))]  # + 0.0: no -0.0


def _sorted_ints(rng, count=(4, 8)) -> list[int]:
    return sorted(rng.sample(range(1, 100), rng.randint(*count)))


def _phrase(rng, count=(2, 4)) -> str:
    return " ".join(rng.sample(WORDS, rng.randint(*count)))


def _repetitive_phrase(rng) -> str:
    words = rng.sample(WORDS, 3)
    return " ".join(rng.choice(words) for _ in range(rng.randint(4, 7)))


def _word_or_phrase(rng) -> str:
    """A word or a phrase, each drawn before one of them is chosen (not ``one_of``, which draws only the one)."""
    return rng.choice([rng.choice(WORDS), _phrase(rng)])


def _date(rng, first_year=1950, last_year=2030) -> datetime.date:
    start = datetime.date(first_year, 1, 1)
    return start + datetime.timedelta(days=rng.randrange((datetime.date(last_year, 12, 31) - start).days))


def _ip(rng, valid=True) -> str:
    """An IPv4 address; an invalid one has one part above 255."""
    parts = [rng.randint(0, 255) for _ in range(4)]
    if not valid:
        parts[rng.randrange(4)] = rng.randint(256, 999)
    return ".".join(map(str, parts))


VALUE_SAMPLERS: dict[str, Callable[..., Any]] = {
    "randint": lambda rng, low, high: rng.randint(low, high),
    "randrange": lambda rng, start, stop, step: rng.randrange(start, stop, step),
    "uniform": lambda rng, low, high, digits: round(rng.uniform(low, high), digits),
    "choice": lambda rng, options: rng.choice(options),
    "square": lambda rng, low, high: rng.randint(low, high) ** 2,
    "binary": lambda rng, low, high: format(rng.randint(low, high), "b"),
    "ints": _ints,
    "floats": _floats,
    "sorted_ints": _sorted_ints,
    "word": lambda rng: rng.choice(WORDS),
    "words": lambda rng, fewest, most: rng.sample(WORDS, rng.randint(fewest, most)),
    "phrase": _phrase,
    "repetitive_phrase": _repetitive_phrase,
    "word_or_phrase": _word_or_phrase,
    "iso_date": lambda rng, first_year, last_year: _date(rng, first_year, last_year).isoformat(),
    "ip": _ip,
}


# ---- whole tools ---------------------------------------------------------------------------------------------


def _binary_search(rng):
    arr = _sorted_ints(rng, (5, 9))
    return {"arr": arr, "target": rng.choice(arr) if rng.random() < 0.7 else rng.randint(1, 99)}


def _cagr(rng):
    start = rng.randrange(1000, 20001, 500)
    return {"start_value": start, "end_value": start + rng.randrange(500, 20001, 500), "years": rng.randint(2, 15)}


def _grade(rng):
    count = rng.randint(2, 4)
    cuts = sorted(rng.sample(range(1, 10), count - 1))
    weights = [round((b - a) / 10, 1) for a, b in zip([0, *cuts], [*cuts, 10])]
    return {"scores": [rng.randint(50, 100) for _ in range(count)], "weights": weights}


def _meetings(rng):
    starts = sorted(rng.sample(range(8, 18), rng.randint(2, 4)))
    return {"intervals": [[s, s + rng.randint(1, 2)] for s in starts]}


def _vectors(rng):
    size = rng.randint(2, 4)
    return {"vector_a": _floats(rng, -5, 5, (size, size)), "vector_b": _floats(rng, -5, 5, (size, size))}


def _format_date(rng):
    source, target = rng.sample(DATE_FORMATS, 2)
    return {"date": _date(rng).strftime(source), "input_format": source, "output_format": target}


def _gcd(rng):
    factor = rng.randint(2, 20)
    return {"a": factor * rng.randint(1, 25), "b": factor * rng.randint(1, 25)}


def _power(rng):
    base = rng.randint(2, 5)
    return {"num": base ** rng.randint(2, 8) if rng.random() < 0.6 else rng.randint(10, 500), "base": base}


def _rotation(rng):
    word = rng.choice(WORDS)
    cut = rng.randint(1, len(word) - 1)
    return {"str1": word, "str2": word[cut:] + word[:cut] if rng.random() < 0.6 else rng.choice(WORDS)}


def _points(rng):
    size = rng.randint(2, 3)
    return {"point1": _floats(rng, -10, 10, (size, size)), "point2": _floats(rng, -10, 10, (size, size))}


def _missing_number(rng):
    numbers = list(range(rng.randint(5, 9)))
    numbers.remove(rng.choice(numbers))
    rng.shuffle(numbers)
    return {"nums": numbers}


def _with_repeats(rng):
    numbers = _ints(rng, 1, 9, (4, 7))
    return {"lst": numbers + rng.sample(numbers, 2)}


def _anagram(rng):
    first, second = rng.choice(ANAGRAMS)
    return {"word1": first, "word2": second if rng.random() < 0.6 else rng.choice(WORDS)}


def _range(rng):
    start = rng.randint(-20, 50)
    return {"start": start, "end": start + rng.randint(0, 40)}


def _dice(rng):
    dice = rng.randint(2, 4)
    return {"target_sum": rng.randint(dice, 4 * dice), "num_dice": dice, "num_faces": rng.choice([4, 6, 8, 10, 12, 20])}


def _subset(rng):
    superset = rng.sample(range(1, 30), rng.randint(4, 7))
    subset = rng.sample(superset, 2) if rng.random() < 0.6 else rng.sample(range(1, 30), 2)
    return {"set1": subset, "set2": superset}


def _peak(rng):
    return {"nums": rng.sample(range(1, 50), rng.randint(5, 8))}


TOOL_SAMPLERS: dict[str, Callable[[random.Random], dict]] = {
    "binary_search": _binary_search,
    "cagr": _cagr,
    "grade": _grade,
    "meetings": _meetings,
    "vectors": _vectors,
    "format_date": _format_date,
    "gcd": _gcd,
    "power": _power,
    "rotation": _rotation,
    "points": _points,
    "missing_number": _missing_number,
    "with_repeats": _with_repeats,
    "anagram": _anagram,
    "range": _range,
    "dice": _dice,
    "subset": _subset,
    "peak": _peak,
}


# ---- specs ---------------------------------------------------------------------------------------------------


def sampler(spec: str | dict) -> Callable[[random.Random], dict]:
    """The argument sampler a catalog entry's ``"sample"`` describes: a whole-tool sampler's name, or an object
    mapping each argument to a value spec."""
    if isinstance(spec, str):
        if spec not in TOOL_SAMPLERS:
            raise DataError(f"unknown tool sampler {spec!r} (known: {', '.join(TOOL_SAMPLERS)})")
        return TOOL_SAMPLERS[spec]
    draws = {name: value_sampler(value) for name, value in spec.items()}
    return lambda rng: {name: draw(rng) for name, draw in draws.items()}


def value_sampler(spec: list) -> Callable[[random.Random], Any]:
    """The sampler of one argument's values that a spec ``[name, *args]`` describes (see the module's doc)."""
    name, *args = spec
    if name == "either":
        chance, first, second = args[0], value_sampler(args[1]), value_sampler(args[2])
        return lambda rng: first(rng) if rng.random() < chance else second(rng)
    if name == "one_of":
        options = [value_sampler(option) for option in args]
        return lambda rng: rng.choice(options)(rng)
    if name not in VALUE_SAMPLERS:
        raise DataError(f"unknown value sampler {name!r} (known: either, one_of, {', '.join(VALUE_SAMPLERS)})")
    draw = VALUE_SAMPLERS[name]
    return lambda rng: draw(rng, *args)
