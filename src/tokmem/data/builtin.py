"""The embedded demo's data: small built-in procedures with exact, deterministic answers.

Each procedure renders a sampled input into one of its query templates and answers with
``format(apply(input))`` and nothing else, so exact match is a fair score.  A procedure whose
output type is the next one's input type composes with it into a chain ('What is the first word
of "red fox", then put it in quotes?'), one step per procedure, each answering the previous result.

The procedures are ones the default backbone (SmolLM2-135M-Instruct) performs when its written
instruction is in the prompt (formatting, copying, picking), not arithmetic it cannot do at all:
the demo compares TokMem with that instructed backbone, so the comparison is about memory.

Values are plain Python: words and texts are ``str``, numbers ``int``, number lists
``list[int]``, dates ``datetime.date``.  Lists render as ``3, 1, 2``.  Queries and answers stay
short so that a 135M model learns the bank on a CPU in minutes.
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
    "apple",
    "river",
    "garden",
    "window",
    "planet",
    "candle",
    "silver",
    "forest",
    "pencil",
    "rocket",
    "orange",
    "basket",
    "dragon",
    "castle",
    "butter",
    "monkey",
    "island",
    "marble",
    "pepper",
    "turtle",
    "violin",
    "yellow",
    "summer",
    "winter",
    "bottle",
    "cookie",
    "guitar",
    "jacket",
    "lemon",
    "mirror",
    "needle",
    "pillow",
    "puzzle",
    "rabbit",
    "saddle",
    "tomato",
    "velvet",
    "wallet",
    "anchor",
    "bridge",
    "cactus",
    "desert",
    "engine",
    "falcon",
    "harbor",
    "jungle",
    "kitten",
    "ladder",
    "meadow",
    "oyster",
    "parrot",
    "ribbon",
    "spider",
    "tunnel",
    "umbrella",
    "valley",
    "walrus",
    "zebra",
    "cloud",
    "stone",
    "music",
    "paper",
    "tiger",
    "honey",
)
MAX_TRIES = 200
REPLY_RULE = "Reply with the result only."


def render(value) -> str:
    """The one text form of a value, in queries and in answers: lists as ``3, 1, 2``."""
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    return str(value)


# The input of each instruction's worked example, by input type: outside what the samplers draw,
# so that an instruction never answers a held-out query.
EXAMPLE_INPUTS = {
    "word": "sun",
    "text": "red fox",
    "numbers": [50, 40, 30],
    "number": 5000,
    "date": datetime.date(1990, 7, 4),
}


@dataclass(frozen=True)
class BuiltinProcedure:
    """One procedure: its written instruction (``description``), query templates, inputs and answers."""

    name: str
    description: str
    input_type: str
    output_type: str
    templates: tuple[str, ...]
    follow_up: str
    sample: Callable[[random.Random], Any]
    apply: Callable[[Any], Any]

    @property
    def example(self):
        return EXAMPLE_INPUTS[self.input_type]

    def format(self, value) -> str:
        return render(value)

    def query(self, value, rng: random.Random) -> str:
        return rng.choice(self.templates).format(x=self.format(value))

    def instruction(self) -> list[dict]:
        """The written instruction as chat turns: the description with a worked example, and its answer.

        SmolLM2-135M answers a bare instruction in full sentences ("The first word of … is …"); one
        worked example makes it reply with the result alone.
        """
        request = f"{self.description} {REPLY_RULE}\n\n{self.templates[0].format(x=self.format(self.example))}"
        return [
            {"role": "user", "content": request},
            {"role": "assistant", "content": self.format(self.apply(self.example))},
        ]


# Input samplers.


def _word(rng):
    return rng.choice(WORDS)


def _text(rng):
    return " ".join(rng.sample(WORDS, rng.randint(2, 3)))


def _numbers(rng):
    """3 or 4 numbers up to 20: SmolLM2 spends a token per digit, comma and space."""
    return [rng.randint(1, 20) for _ in range(rng.randint(3, 4))]


def _number(rng):
    return rng.randint(1, 999)


def _date(rng):
    return datetime.date(2000, 1, 1) + datetime.timedelta(days=rng.randrange(30 * 365))


_P = BuiltinProcedure
_ALL = (
    # Words.
    _P(
        "quote_word",
        "Put the word in double quotes.",
        "word",
        "quoted",
        ("Put {x} in quotes.", "Wrap {x} in double quotes.", "Quote the word {x}."),
        "then put it in quotes",
        _word,
        lambda w: f'"{w}"',
    ),
    _P(
        "bracket_word",
        "Put the word in square brackets.",
        "word",
        "bracketed",
        ("Put {x} in square brackets.", "Wrap {x} in brackets.", "Enclose {x} in square brackets."),
        "then put it in brackets",
        _word,
        lambda w: f"[{w}]",
    ),
    _P(
        "parenthesize_word",
        "Put the word in parentheses.",
        "word",
        "parenthesized",
        ("Put {x} in parentheses.", "Wrap {x} in round brackets.", "Enclose {x} in parentheses."),
        "then put it in parentheses",
        _word,
        lambda w: f"({w})",
    ),
    _P(
        "file_name",
        "Turn the word into a .txt file name.",
        "word",
        "file name",
        ("Make a .txt file name from {x}.", "Turn {x} into a text file name.", "Name a .txt file after {x}."),
        "then make it a file name",
        _word,
        lambda w: f"{w}.txt",
    ),
    # Phrases.
    _P(
        "first_word",
        "Give the first word of the phrase.",
        "text",
        "word",
        ('What is the first word of "{x}"?', 'Give the first word in "{x}".', 'Which word comes first in "{x}"?'),
        "then take the first word",
        _text,
        lambda t: t.split()[0],
    ),
    _P(
        "snake_case",
        "Join the words of the phrase with underscores.",
        "text",
        "word",
        (
            'Write "{x}" in snake case.',
            'Join the words of "{x}" with underscores.',
            'Turn "{x}" into a snake_case name.',
        ),
        "then join the words with underscores",
        _text,
        lambda t: "_".join(t.split()),
    ),
    _P(
        "kebab_case",
        "Join the words of the phrase with hyphens.",
        "text",
        "word",
        ('Write "{x}" in kebab case.', 'Join the words of "{x}" with hyphens.', 'Turn "{x}" into a kebab-case name.'),
        "then join the words with hyphens",
        _text,
        lambda t: "-".join(t.split()),
    ),
    _P(
        "comma_list",
        "Separate the words of the phrase with commas.",
        "text",
        "word list",
        (
            'Separate the words of "{x}" with commas.',
            'List the words of "{x}" with commas.',
            'Put commas between the words of "{x}".',
        ),
        "then separate the words with commas",
        _text,
        lambda t: ", ".join(t.split()),
    ),
    _P(
        "exclaim",
        "Add an exclamation mark to the end of the phrase.",
        "text",
        "exclamation",
        ('Add an exclamation mark to "{x}".', 'Turn "{x}" into an exclamation.', 'End "{x}" with an exclamation mark.'),
        "then add an exclamation mark",
        _text,
        lambda t: f"{t}!",
    ),
    _P(
        "question",
        "Add a question mark to the end of the phrase.",
        "text",
        "question",
        ('Add a question mark to "{x}".', 'Turn "{x}" into a question.', 'End "{x}" with a question mark.'),
        "then add a question mark",
        _text,
        lambda t: f"{t}?",
    ),
    # Lists of numbers.
    _P(
        "first_number",
        "Give the first number of the list.",
        "numbers",
        "number",
        ("What is the first number in {x}?", "Give the first entry of {x}.", "Which number comes first in {x}?"),
        "then take the first number",
        _numbers,
        lambda xs: xs[0],
    ),
    _P(
        "json_list",
        "Write the list of numbers as a JSON array.",
        "numbers",
        "json",
        ("Write {x} as a JSON list.", "Format {x} as a JSON array.", "Give {x} in JSON list form."),
        "then write them as a JSON list",
        _numbers,
        json.dumps,
    ),
    _P(
        "semicolon_list",
        "Separate the numbers with semicolons.",
        "numbers",
        "semicolon list",
        ("Separate {x} with semicolons.", "List {x} with semicolons between them.", "Write {x} using semicolons."),
        "then separate them with semicolons",
        _numbers,
        lambda xs: "; ".join(map(str, xs)),
    ),
    # Numbers.
    _P(
        "wrap_json",
        'Wrap the number in a JSON object as {"value": number}.',
        "number",
        "json",
        (
            'Wrap {x} in JSON under the key "value".',
            "Return {x} as a JSON object.",
            "Give the JSON object for the value {x}.",
        ),
        "then wrap it in JSON",
        _number,
        lambda n: json.dumps({"value": n}),
    ),
    _P(
        "dollars",
        "Write the number as an amount in US dollars.",
        "number",
        "money",
        ("Write {x} as dollars.", "Give {x} as a dollar amount.", "Format {x} in US dollars."),
        "then write it in dollars",
        _number,
        lambda n: f"${n}",
    ),
    _P(
        "percent",
        "Write the number as a percentage.",
        "number",
        "percentage",
        ("Write {x} as a percentage.", "Give {x} as a percent.", "Format {x} with a percent sign."),
        "then write it as a percentage",
        _number,
        lambda n: f"{n}%",
    ),
    _P(
        "kilograms",
        "Write the number as a weight in kilograms (kg).",
        "number",
        "weight",
        ("Write {x} as kilograms.", "Give {x} as a weight in kg.", "Format {x} in kilograms."),
        "then write it in kilograms",
        _number,
        lambda n: f"{n} kg",
    ),
    _P(
        "negate",
        "Write the number with a minus sign.",
        "number",
        "negative",
        ("What is the negative of {x}?", "Put a minus sign before {x}.", "Write {x} as a negative number."),
        "then make it negative",
        _number,
        lambda n: -n,
    ),
    # Dates.
    _P(
        "year_of_date",
        "Give the year of a YYYY-MM-DD date.",
        "date",
        "number",
        ("What year is {x}?", "Give the year of {x}.", "In which year is {x}?"),
        "then take its year",
        _date,
        lambda d: d.year,
    ),
    _P(
        "date_slashes",
        "Write the YYYY-MM-DD date with slashes as YYYY/MM/DD.",
        "date",
        "slashed date",
        ("Write {x} with slashes.", "Give {x} as YYYY/MM/DD.", "Format {x} using slashes."),
        "then write it with slashes",
        _date,
        lambda d: d.strftime("%Y/%m/%d"),
    ),
)
PROCEDURES: dict[str, BuiltinProcedure] = {p.name: p for p in _ALL}


def catalog() -> dict[str, str]:
    return {name: p.description for name, p in PROCEDURES.items()}


def _run(procs, value) -> list | None:
    """Each step's result, or None when a step is trivial (empty, or leaves its input unchanged)."""
    results = []
    for proc in procs:
        output = proc.apply(value)
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


def instructed_prompt(procedure_names, query: str) -> list[dict]:
    """The query after the written instruction of each named procedure, as chat turns.

    This is what a memory token replaces: the demo gives it to the plain backbone for comparison.
    """
    _check_known(procedure_names)
    turns = [turn for name in procedure_names for turn in PROCEDURES[name].instruction()]
    return turns + [{"role": "user", "content": query}]
