"""The embedded demo's data: small built-in procedures with exact, deterministic answers.

Each procedure renders a sampled input into one of its query templates and answers with
``format(apply(input))`` and nothing else, so exact match is a fair score.  A procedure whose
output type is the next one's input type composes with it into a chain ("Sort the numbers
5, 2, 9, then take the maximum."), one step per procedure, each answering the previous result.

Values are plain Python: words and texts are ``str``, numbers ``int``, number lists
``list[int]``, pairs ``tuple[int, int]``, dates ``datetime.date``.  Lists render as ``3, 1, 2``.
Queries and answers stay short so that a 135M model learns the bank on a CPU in minutes.
"""

from __future__ import annotations

import datetime
import functools
import itertools
import json
import random
from dataclasses import dataclass, replace
from typing import Any, Callable

from tokmem.data.procedures import Example, Step
from tokmem.errors import DataError

WORDS = (
    "apple", "river", "garden", "window", "planet", "candle", "silver", "forest", "pencil", "rocket",
    "orange", "basket", "dragon", "castle", "butter", "monkey", "island", "marble", "pepper", "turtle",
    "violin", "yellow", "summer", "winter", "bottle", "cookie", "guitar", "jacket", "lemon", "mirror",
    "needle", "pillow", "puzzle", "rabbit", "saddle", "tomato", "velvet", "wallet", "anchor", "bridge",
    "cactus", "desert", "engine", "falcon", "harbor", "jungle", "kitten", "ladder", "meadow", "oyster",
    "parrot", "ribbon", "spider", "tunnel", "umbrella", "valley", "walrus", "zebra", "cloud", "stone",
    "music", "paper", "tiger", "honey",
)
VOWELS = "aeiou"
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December")
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
SMALL_NUMBERS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
                 "fourteen fifteen sixteen seventeen eighteen nineteen").split()
TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
MAX_TRIES = 200


def render(value) -> str:
    """The one text form of a value, in queries and in answers: lists as ``3, 1, 2``."""
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    return str(value)


@dataclass(frozen=True)
class BuiltinProcedure:
    name: str
    description: str
    input_type: str
    output_type: str
    templates: tuple[str, ...]
    follow_up: str
    sample: Callable[[random.Random], Any]
    apply: Callable[[Any], Any]

    def format(self, value) -> str:
        return render(value)

    def query(self, value, rng: random.Random) -> str:
        """One of the templates filled with ``value`` ({x}; a pair also fills {a} and {b})."""
        slots = {"x": self.format(value)}
        if isinstance(value, tuple):
            slots["a"], slots["b"] = value
        return rng.choice(self.templates).format(**slots)


# Input samplers.

def _word(rng):
    return rng.choice(WORDS)


def _mixed_case_word(rng):
    return "".join(c.upper() if rng.random() < 0.5 else c for c in rng.choice(WORDS))


def _text(rng):
    return " ".join(rng.sample(WORDS, rng.randint(2, 3)))


def _numbers(rng):
    """3 or 4 numbers up to 20: SmolLM2 spends a token per digit, comma and space."""
    return [rng.randint(1, 20) for _ in range(rng.randint(3, 4))]


def _numbers_with_repeat(rng):
    numbers = _numbers(rng)
    numbers.insert(rng.randrange(len(numbers) + 1), rng.choice(numbers))
    return numbers


def _number(low, high):
    return lambda rng: rng.randint(low, high)


def _pair(first, second):
    """Two numbers drawn from the inclusive ranges ``first`` and ``second``."""
    return lambda rng: (rng.randint(*first), rng.randint(*second))


def _descending_pair(rng):
    return tuple(sorted(rng.sample(range(2, 100), 2), reverse=True))


def _date(rng):
    return datetime.date(2000, 1, 1) + datetime.timedelta(days=rng.randrange(30 * 365))


# Operations that need more than a lambda.

def _count_vowels(word):
    return sum(c in VOWELS for c in word.lower())


def _remove_vowels(word):
    return "".join(c for c in word if c.lower() not in VOWELS)


def _number_words(n):
    if not 0 <= n < 100:
        raise ValueError(f"only 0..99 are spelled out, not {n}")
    if n < 20:
        return SMALL_NUMBERS[n]
    tens, ones = divmod(n, 10)
    return TENS[tens] + (f"-{SMALL_NUMBERS[ones]}" if ones else "")


def _binary(n):
    if n < 0:
        raise ValueError(f"no binary form for negative {n}")
    return format(n, "b")


def _long_date(day):
    return f"{MONTHS[day.month - 1]} {day.day}, {day.year}"


_P = BuiltinProcedure
_ALL = (
    # Words.
    _P("reverse_word", "Writes a word backwards.", "word", "word",
       ("Reverse the word {x}.", "What is {x} spelled backwards?", "Write {x} in reverse."),
       "then reverse it", _word, lambda w: w[::-1]),
    _P("uppercase_word", "Converts a word to capital letters.", "word", "word",
       ("Convert {x} to uppercase.", "Write {x} in capital letters.", "What is {x} in all caps?"),
       "then make it uppercase", _word, str.upper),
    _P("lowercase_word", "Converts a word to small letters.", "word", "word",
       ("Convert {x} to lowercase.", "Write {x} in small letters.", "What is {x} with no capital letters?"),
       "then make it lowercase", _mixed_case_word, str.lower),
    _P("count_vowels", "Counts the vowels (a, e, i, o, u) in a word.", "word", "number",
       ("How many vowels are in {x}?", "Count the vowels in {x}.", "What is the vowel count of {x}?"),
       "then count its vowels", _word, _count_vowels),
    _P("count_letters", "Counts the characters of a word.", "word", "number",
       ("How many letters does {x} have?", "How long is the word {x}?", "Count the characters in {x}."),
       "then count its letters", _word, len),
    _P("sort_letters", "Sorts the letters of a word alphabetically.", "word", "word",
       ("Sort the letters of {x} alphabetically.", "Put the letters of {x} in alphabetical order.",
        "Arrange the letters in {x} from a to z."),
       "then sort its letters", _word, lambda w: "".join(sorted(w))),
    _P("remove_vowels", "Deletes every vowel from a word.", "word", "word",
       ("Remove the vowels from {x}.", "Write {x} without its vowels.", "Drop every vowel in {x}."),
       "then remove its vowels", _word, _remove_vowels),
    # Phrases.
    _P("acronym", "Forms an uppercase acronym from the first letters of a phrase.", "text", "word",
       ('Make an acronym from "{x}".', 'What are the initials of "{x}"?', 'Abbreviate "{x}" to its first letters.'),
       "then make an acronym of it", _text, lambda t: "".join(w[0] for w in t.split()).upper()),
    _P("capitalize_words", "Capitalises the first letter of every word of a phrase.", "text", "text",
       ('Capitalize each word in "{x}".', 'Write "{x}" in title case.', 'Give "{x}" with every word capitalized.'),
       "then capitalize each word", _text, lambda t: " ".join(w.capitalize() for w in t.split())),
    _P("count_words", "Counts the words of a phrase.", "text", "number",
       ('How many words are in "{x}"?', 'Count the words in "{x}".', 'What is the word count of "{x}"?'),
       "then count the words", _text, lambda t: len(t.split())),
    _P("reverse_words", "Reverses the order of the words of a phrase.", "text", "text",
       ('Reverse the order of the words in "{x}".', 'Write "{x}" with the words backwards.',
        'Say "{x}" last word first.'),
       "then reverse the word order", _text, lambda t: " ".join(reversed(t.split()))),
    _P("longest_word", "Finds the longest word of a phrase (the first one on a tie).", "text", "word",
       ('Which word in "{x}" is the longest?', 'Find the longest word in "{x}".', 'What is the longest word of "{x}"?'),
       "then take the longest word", _text, lambda t: max(t.split(), key=len)),
    # Lists of numbers.
    _P("sort_numbers", "Sorts a list of numbers in ascending order.", "numbers", "numbers",
       ("Sort the numbers {x}.", "Put {x} in ascending order.", "Arrange {x} from smallest to largest."),
       "then sort them", _numbers, sorted),
    _P("max_number", "Finds the largest number of a list.", "numbers", "number",
       ("What is the largest of {x}?", "Find the maximum of {x}.", "Which number is biggest among {x}?"),
       "then take the maximum", _numbers, max),
    _P("min_number", "Finds the smallest number of a list.", "numbers", "number",
       ("What is the smallest of {x}?", "Find the minimum of {x}.", "Which number is lowest among {x}?"),
       "then take the minimum", _numbers, min),
    _P("sum_numbers", "Adds up a list of numbers.", "numbers", "number",
       ("Add up the numbers {x}.", "What is the total of {x}?", "Compute the sum of {x}."),
       "then add them up", _numbers, sum),
    _P("reverse_list", "Reverses the order of a list of numbers.", "numbers", "numbers",
       ("Reverse the list {x}.", "Write the list {x} backwards.", "Give {x} in the opposite order."),
       "then reverse the list", _numbers, lambda xs: xs[::-1]),
    _P("remove_duplicates", "Drops repeated numbers from a list, keeping first occurrences.", "numbers", "numbers",
       ("Remove the duplicates from {x}.", "List {x} without repeats.", "Keep one copy of each number in {x}."),
       "then drop the duplicates", _numbers_with_repeat, lambda xs: list(dict.fromkeys(xs))),
    _P("count_items", "Counts the numbers in a list.", "numbers", "number",
       ("How many numbers are in the list {x}?", "Count the items in {x}.", "Tell me how many entries {x} has."),
       "then count them", _numbers, len),
    _P("filter_evens", "Keeps only the even numbers of a list.", "numbers", "numbers",
       ("Keep only the even numbers in {x}.", "Which of {x} are even?", "Filter {x} down to its even numbers."),
       "then keep the even ones", _numbers, lambda xs: [x for x in xs if x % 2 == 0]),
    # Arithmetic.
    _P("add_numbers", "Adds two numbers.", "pair", "number",
       ("What is {a} plus {b}?", "Add {a} and {b}.", "Compute {a} + {b}."),
       "then add the two numbers", _pair((2, 99), (2, 99)), lambda p: p[0] + p[1]),
    _P("multiply_numbers", "Multiplies two numbers.", "pair", "number",
       ("What is {a} times {b}?", "Multiply {a} by {b}.", "Compute {a} * {b}."),
       "then multiply the two numbers", _pair((2, 20), (2, 20)), lambda p: p[0] * p[1]),
    _P("subtract_numbers", "Subtracts the second number from the first.", "pair", "number",
       ("What is {a} minus {b}?", "Subtract {b} from {a}.", "Compute {a} - {b}."),
       "then subtract the second from the first", _descending_pair, lambda p: p[0] - p[1]),
    _P("modulo", "Gives the remainder of dividing the first number by the second.", "pair", "number",
       ("What is {a} mod {b}?", "Find the remainder when {a} is divided by {b}.", "Compute {a} modulo {b}."),
       "then take the remainder", _pair((10, 99), (2, 9)), lambda p: p[0] % p[1]),
    _P("square_number", "Multiplies a number by itself.", "number", "number",
       ("What is {x} squared?", "Square the number {x}.", "Compute {x} to the power of two."),
       "then square it", _number(2, 30), lambda n: n * n),
    _P("double_number", "Multiplies a number by two.", "number", "number",
       ("Double the number {x}.", "What is twice {x}?", "Give two times {x}."),
       "then double it", _number(2, 99), lambda n: 2 * n),
    _P("sum_digits", "Adds up the decimal digits of a number.", "number", "number",
       ("What is the digit sum of {x}?", "Add the digits of {x}.", "Sum up the digits in {x}."),
       "then add up its digits", _number(10, 9999), lambda n: sum(map(int, str(n)))),
    # Formatting.
    _P("format_date", "Writes a YYYY-MM-DD date as 'Month day, year'.", "date", "long_date",
       ("Write the date {x} out in full.", "Format {x} as month day, year.", "How is {x} written as a long date?"),
       "then write it as a long date", _date, _long_date),
    _P("day_of_week", "Names the weekday of a YYYY-MM-DD date.", "date", "weekday",
       ("What day of the week was {x}?", "Name the weekday of {x}.", "On which weekday does {x} fall?"),
       "then name its weekday", _date, lambda d: WEEKDAYS[d.weekday()]),
    _P("to_binary", "Writes a number in base 2.", "number", "binary",
       ("Convert {x} to binary.", "What is {x} in base 2?", "Write {x} as a binary number."),
       "then convert it to binary", _number(1, 63), _binary),
    _P("number_to_words", "Spells out a number from 0 to 99 in English words.", "number", "words",
       ("Spell out the number {x}.", "Write {x} in English words.", "How do you say {x} in words?"),
       "then spell it out", _number(0, 99), _number_words),
    _P("wrap_json", 'Wraps a number in a JSON object as {"value": x}.', "number", "json",
       ('Wrap {x} in JSON under the key "value".', "Return {x} as a JSON object.",
        "Give the JSON object for the value {x}."),
       "then wrap it in JSON", _number(1, 999), lambda n: json.dumps({"value": n})),
)
PROCEDURES: dict[str, BuiltinProcedure] = {p.name: p for p in _ALL}


def catalog() -> dict[str, str]:
    return {name: p.description for name, p in PROCEDURES.items()}


def _run(procs, value) -> list | None:
    """Each step's result, or None when a step fails or is trivial (empty, or leaves its input unchanged)."""
    results = []
    for proc in procs:
        try:
            output = proc.apply(value)
        except ValueError:
            return None
        if not render(output) or render(output) == render(value):
            return None
        results.append(output)
        value = output
    return results


def _query(procs, value, rng) -> str:
    """The first procedure's query, with any later procedures' follow-ups before its final punctuation."""
    base = procs[0].query(value, rng)
    follow_ups = "".join(f", {p.follow_up}" for p in procs[1:])
    return f"{base[:-1]}{follow_ups}{base[-1]}"


def _composes(names) -> bool:
    """Whether each procedure takes the type the one before it gives."""
    return all(PROCEDURES[a].output_type == PROCEDURES[b].input_type for a, b in zip(names, names[1:]))


def _check_known(names) -> None:
    unknown = [n for n in names if n not in PROCEDURES]
    if unknown:
        raise DataError(f"unknown built-in procedure(s): {', '.join(unknown)}")


def _pipeline(proc_names) -> list[BuiltinProcedure]:
    """The named procedures in order, each taking what the one before gives."""
    if not proc_names:
        raise DataError("an example needs at least one procedure")
    _check_known(proc_names)
    if not _composes(proc_names):
        raise DataError(f"type mismatch in the chain {' -> '.join(proc_names)}")
    return [PROCEDURES[n] for n in proc_names]


def make_example(proc_names: list[str], rng: random.Random) -> Example:
    """A fresh example of one procedure (atomic) or a pipeline of several (a chain)."""
    procs = _pipeline(proc_names)
    for _ in range(MAX_TRIES):
        value = procs[0].sample(rng)
        results = _run(procs, value)
        if results is not None:
            steps = tuple(Step(p.name, p.format(r)) for p, r in zip(procs, results))
            return Example(_query(procs, value, rng), steps)
    raise DataError(f"no valid input found for {' -> '.join(proc_names)}")


@functools.cache
def _viable(pipeline: tuple[str, ...]) -> bool:
    """Whether the pipeline ever gives a non-trivial answer (probed with a fixed seed, so any seed agrees)."""
    procs = [PROCEDURES[n] for n in pipeline]
    rng = random.Random(0)
    return any(_run(procs, procs[0].sample(rng)) is not None for _ in range(30))


def chain_pipelines(names) -> dict[int, list[tuple[str, ...]]]:
    """Viable pipelines of 2 and 3 distinct, type-compatible procedures, by length."""
    by_length = {}
    for length in (2, 3):
        candidates = itertools.permutations(names, length)
        by_length[length] = [c for c in candidates if _composes(c) and _viable(c)]
    return by_length


def _random_chain(pipelines, rng) -> Example:
    length = rng.choice([n for n, found in pipelines.items() if found])
    return make_example(list(rng.choice(pipelines[length])), rng)


def _fresh(draw, count, prefix, taken) -> list[Example]:
    """``count`` examples from ``draw()`` whose queries are not in ``taken`` (which grows), ids ``prefix-k``."""
    examples, attempts = [], 0
    while len(examples) < count:
        attempts += 1
        if attempts > count * MAX_TRIES:
            raise DataError(f"could not draw {count} distinct '{prefix}' queries")
        example = draw()
        if example.query not in taken:
            taken.add(example.query)
            examples.append(replace(example, id=f"{prefix}-{len(examples)}"))
    return examples


def _split(names, pipelines, split, per_procedure, chains, rng, taken) -> list[Example]:
    examples = []
    for name in names:
        examples += _fresh(lambda: make_example([name], rng), per_procedure, f"{name}-{split}", taken)
    if any(pipelines.values()):
        examples += _fresh(lambda: _random_chain(pipelines, rng), chains, f"chain-{split}", taken)
    return examples


def demo_dataset(
    seed: int = 0,
    train_per_procedure: int = 12,
    test_per_procedure: int = 4,
    train_chains: int = 40,
    test_chains: int = 12,
    procedures: list[str] | None = None,
) -> tuple[list[Example], list[Example]]:
    """(train, test) for the demo; no test query appears in training, and a seed gives the same sets.

    ``procedures`` restricts both sets, chains included, to those names.
    """
    if procedures is not None:
        _check_known(procedures)
    names = [n for n in PROCEDURES if procedures is None or n in procedures]
    pipelines = chain_pipelines(names)
    rng = random.Random(seed)
    taken: set[str] = set()
    train = _split(names, pipelines, "train", train_per_procedure, train_chains, rng, taken)
    test = _split(names, pipelines, "test", test_per_procedure, test_chains, rng, taken)
    return train, test
