"""The built-in tool catalog: 50 tools in the style of APIGen / xLAM, as a table written in Python.

Each tool is one procedure, with a JSON-schema signature, an argument sampler (a function, hence code and not a
data file) and query templates; its calls are never executed, the call itself is the answer.  25 tools are for the
adaptation phase and 25 for evaluation (after the paper's evaluation tools), disjoint.  A call is rendered as
compact JSON ``{"name": …, "arguments": {…}}`` (arguments in the order of the tool's signature).  To go beyond
25 + 25 tools, pass your own ``Tool`` objects wherever tool names are accepted.
"""

from __future__ import annotations

import datetime
import json
import random
import string
from dataclasses import dataclass
from typing import Callable

from tokmem.data.builtin import WORDS
from tokmem.data.procedures import Step, call_json
from tokmem.errors import DataError

ADAPTATION, EVALUATION = "adaptation", "evaluation"

INT, NUM, STR, BOOL = {"type": "integer"}, {"type": "number"}, {"type": "string"}, {"type": "boolean"}


def array_of(item: dict) -> dict:
    return {"type": "array", "items": item}


# ---- tools -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    name: str
    type: dict  # the JSON schema of a value, e.g. {"type": "array", "items": {"type": "integer"}}
    description: str
    required: bool = True


@dataclass(frozen=True)
class Tool:
    """A callable tool: its signature, a sampler of argument values, and query templates.

    A template names the arguments it mentions as ``{param}`` placeholders, and a call made from it
    carries exactly those arguments (so an optional argument appears only when the query asks for it).
    A template may also be ``(text, fixed)``: ``fixed`` arguments the wording implies ("without
    special characters" → ``include_special: false``).
    """

    name: str
    description: str
    params: tuple[Param, ...]
    sample: Callable[[random.Random], dict]
    templates: tuple
    group: str

    def schema(self) -> dict:
        properties = {p.name: {**p.type, "description": p.description} for p in self.params}
        required = [p.name for p in self.params if p.required]
        return {
            "name": self.name,
            "description": self.description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        }

    def draw(self, rng: random.Random) -> tuple[str, Step]:
        """A query asking for one call of this tool, and that call."""
        template = rng.choice(self.templates)
        text, fixed = (template, {}) if isinstance(template, str) else template
        values = self.sample(rng)
        mentioned = {field for _, field, _, _ in string.Formatter().parse(text) if field}
        named = mentioned | set(fixed)
        arguments = {p.name: fixed.get(p.name, values.get(p.name)) for p in self.params if p.name in named}
        query = text.format(**{name: _show(value) for name, value in values.items()})
        return query, Step(self.name, call_json(self.name, arguments))


def _show(value) -> str:
    """A value as a query shows it: strings as they are, numbers and lists as JSON."""
    return value if isinstance(value, str) else json.dumps(value)


# ---- argument samplers -------------------------------------------------------------------------------

PALINDROMES = ("racecar", "level", "radar", "civic", "kayak", "rotor", "madam", "refer", "stats", "noon")
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
ARMSTRONG = (153, 370, 371, 407, 1634, 8208, 9474)
DATE_FORMATS = ("%Y-%m-%d", "%d/%m/%Y", "%m-%d-%Y", "%B %d, %Y", "%d.%m.%Y")


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


def _date(rng, first_year=1950, last_year=2030) -> datetime.date:
    start = datetime.date(first_year, 1, 1)
    return start + datetime.timedelta(days=rng.randrange((datetime.date(last_year, 12, 31) - start).days))


def _ip(rng, valid=True) -> str:
    parts = [rng.randint(0, 255) for _ in range(4)]
    if not valid:
        parts[rng.randrange(4)] = rng.randint(256, 999)
    return ".".join(map(str, parts))


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


def _quadratic(rng):
    return {"a": rng.choice([-3, -2, -1, 1, 2, 3, 4, 5]), "b": rng.randint(-20, 20), "c": rng.randint(-20, 20)}


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


# ---- the catalog -----------------------------------------------------------------------------------------


def _tool(group, name, description, params, sample, *templates) -> Tool:
    return Tool(name, description, tuple(params), sample, templates, group)


P = Param
_E, _A = EVALUATION, ADAPTATION
_ALL = (
    # Evaluation tools, after the paper's (APIGen) evaluation set.
    _tool(
        _E,
        "binary_addition",
        "Adds two binary numbers and returns the result as a binary string.",
        [P("a", STR, "The first binary number."), P("b", STR, "The second binary number.")],
        lambda r: {"a": format(r.randint(1, 255), "b"), "b": format(r.randint(1, 255), "b")},
        "Add the binary numbers {a} and {b}.",
        "Compute the sum of the binary strings '{a}' and '{b}'.",
        "Give me the result of adding binary {a} to binary {b}.",
    ),
    _tool(
        _E,
        "binary_search",
        "Performs binary search on a sorted list to find the index of a target value.",
        [P("arr", array_of(INT), "The sorted list of integers."), P("target", INT, "The value to find.")],
        _binary_search,
        "Find the index of {target} in the sorted list {arr}.",
        "Use binary search to locate {target} in {arr}.",
        "Search the sorted array {arr} for the value {target}.",
    ),
    _tool(
        _E,
        "cagr",
        "Calculates the Compound Annual Growth Rate (CAGR) of an investment.",
        [
            P("start_value", NUM, "The initial value of the investment."),
            P("end_value", NUM, "The final value of the investment."),
            P("years", INT, "The number of years."),
        ],
        _cagr,
        "Calculate the CAGR of an investment that grew from {start_value} to {end_value} in {years} years.",
        "Compute the compound annual growth rate for a start value of {start_value}, an end value of {end_value} "
        "and a period of {years} years.",
        "Find the annual growth rate of a portfolio that went from ${start_value} to ${end_value} over {years} years.",
    ),
    _tool(
        _E,
        "calculate_factorial",
        "Calculates the factorial of a non-negative integer.",
        [P("n", INT, "The non-negative integer.")],
        lambda r: {"n": r.randint(0, 20)},
        "Calculate the factorial of {n}.",
        "Compute {n} factorial.",
        "Find the factorial of the number {n}.",
    ),
    _tool(
        _E,
        "calculate_grade",
        "Calculates the weighted average grade based on scores and their corresponding weights.",
        [P("scores", array_of(NUM), "The scores."), P("weights", array_of(NUM), "The weight of each score.")],
        _grade,
        "Calculate the weighted average grade for the scores {scores} with the weights {weights}.",
        "Compute my final grade from the scores {scores} weighted by {weights}.",
        "Work out the weighted grade given the scores {scores} and the weights {weights}.",
    ),
    _tool(
        _E,
        "calculate_median",
        "Calculates the median of a list of numbers.",
        [P("numbers", array_of(NUM), "The list of numbers.")],
        lambda r: {"numbers": _ints(r, 1, 100)},
        "Calculate the median of {numbers}.",
        "Find the median value of the list {numbers}.",
        "Determine the middle value of {numbers}.",
    ),
    _tool(
        _E,
        "can_attend_all_meetings",
        "Determines if a person can attend all meetings given a list of meeting time intervals.",
        [P("intervals", array_of(array_of(INT)), "The meeting intervals as [start, end] pairs.")],
        _meetings,
        "Check whether a person can attend all meetings with the time intervals {intervals}.",
        "Determine if someone can attend every meeting in the schedule {intervals}.",
        "Tell me if the meetings {intervals} can all be attended without overlap.",
    ),
    _tool(
        _E,
        "cosine_similarity",
        "Calculates the cosine similarity between two vectors.",
        [P("vector_a", array_of(NUM), "The first vector."), P("vector_b", array_of(NUM), "The second vector.")],
        _vectors,
        "Calculate the cosine similarity between the vectors {vector_a} and {vector_b}.",
        "Compute how similar the vectors {vector_a} and {vector_b} are using cosine similarity.",
        "Find the cosine similarity of {vector_a} and {vector_b}.",
    ),
    _tool(
        _E,
        "count_bits",
        "Counts the number of set bits (1's) in the binary representation of a number.",
        [P("num", INT, "The input number.")],
        lambda r: {"num": r.randint(1, 1024)},
        "Count the set bits in the number {num}.",
        "Find how many 1's are in the binary representation of {num}.",
        "Tell me the number of set bits of {num}.",
    ),
    _tool(
        _E,
        "fibonacci",
        "Calculates the nth Fibonacci number.",
        [P("n", INT, "The position in the Fibonacci sequence.")],
        lambda r: {"n": r.randint(1, 40)},
        "Calculate the Fibonacci number at position {n}.",
        "Compute the Fibonacci number for n = {n}.",
        "Give me term number {n} of the Fibonacci sequence.",
    ),
    _tool(
        _E,
        "final_velocity",
        "Calculates the final velocity of an object given its initial velocity, acceleration, and time.",
        [
            P("initial_velocity", NUM, "The initial velocity."),
            P("acceleration", NUM, "The acceleration."),
            P("time", NUM, "The time elapsed."),
        ],
        lambda r: {
            "initial_velocity": round(r.uniform(0, 30), 1),
            "acceleration": round(r.uniform(0.5, 10), 1),
            "time": r.randint(1, 20),
        },
        "Calculate the final velocity of an object with an initial velocity of {initial_velocity} m/s, "
        "an acceleration of {acceleration} m/s^2 and a time of {time} s.",
        "Find the final velocity of an object that starts at {initial_velocity} m/s and accelerates at "
        "{acceleration} m/s^2 for {time} seconds.",
        "Compute the final speed given an initial velocity of {initial_velocity}, an acceleration of "
        "{acceleration} and a time of {time}.",
    ),
    _tool(
        _E,
        "find_first_non_repeating_char",
        "Finds the first non-repeating character in a string.",
        [P("s", STR, "The input string.")],
        lambda r: {"s": r.choice(WORDS)},
        "Find the first non-repeating character in '{s}'.",
        "Identify the first character of '{s}' that does not repeat.",
        "Get the first unique character of the string '{s}'.",
    ),
    _tool(
        _E,
        "find_longest_word",
        "Finds the longest word in a list of words.",
        [P("words", array_of(STR), "The list of words.")],
        lambda r: {"words": r.sample(WORDS, r.randint(3, 5))},
        "Find the longest word in {words}.",
        "Pick the longest word from the list {words}.",
        "Determine the longest of the words {words}.",
    ),
    _tool(
        _E,
        "find_max_subarray_sum",
        "Finds the maximum sum of a contiguous subarray within a list of integers.",
        [P("nums", array_of(INT), "The list of integers.")],
        lambda r: {"nums": _ints(r, -10, 10, (6, 9))},
        "Find the maximum sum of a contiguous subarray in {nums}.",
        "Compute the largest subarray sum of {nums}.",
        "Determine the maximum subarray sum for the list {nums}.",
    ),
    _tool(
        _E,
        "format_date",
        "Converts a date string from one format to another.",
        [
            P("date", STR, "The date string."),
            P("input_format", STR, "The format of the date string."),
            P("output_format", STR, "The desired format."),
        ],
        _format_date,
        "Convert the date '{date}' from {input_format} to {output_format}.",
        "Reformat '{date}', which is in the format {input_format}, into {output_format}.",
        "Change the date {date} from the format '{input_format}' to the format '{output_format}'.",
    ),
    _tool(
        _E,
        "generate_password",
        "Generates a random password of specified length and character types.",
        [
            P("length", INT, "The length of the password."),
            P("include_special", BOOL, "Whether to include special characters (default true).", required=False),
        ],
        lambda r: {"length": r.randint(8, 24)},
        "Generate a password of length {length}.",
        ("Create a {length}-character password that includes special characters.", {"include_special": True}),
        ("Generate a {length}-character password without special characters.", {"include_special": False}),
    ),
    _tool(
        _E,
        "greatest_common_divisor",
        "Computes the greatest common divisor (GCD) of two non-negative integers.",
        [P("a", INT, "The first number."), P("b", INT, "The second number.")],
        _gcd,
        "Find the greatest common divisor of {a} and {b}.",
        "Compute the GCD of {a} and {b}.",
        "Calculate gcd({a}, {b}).",
    ),
    _tool(
        _E,
        "is_leap_year",
        "Checks if a year is a leap year.",
        [P("year", INT, "The year to check.")],
        lambda r: {"year": r.randint(1800, 2100)},
        "Check if {year} is a leap year.",
        "Determine whether the year {year} is a leap year.",
        "Tell me whether {year} was a leap year.",
    ),
    _tool(
        _E,
        "is_palindrome",
        "Checks if a string is a palindrome.",
        [P("text", STR, "The input string.")],
        lambda r: {"text": r.choice(r.choice([PALINDROMES, WORDS]))},
        "Check if '{text}' is a palindrome.",
        "Determine whether the string '{text}' reads the same backwards.",
        "Tell me if '{text}' is a palindrome.",
    ),
    _tool(
        _E,
        "is_power",
        "Checks if a number is a power of a given base.",
        [P("num", INT, "The number to check."), P("base", INT, "The base.")],
        _power,
        "Check if {num} is a power of {base}.",
        "Determine whether {num} is an exact power of {base}.",
        "Tell me if {num} can be written as {base} raised to an integer.",
    ),
    _tool(
        _E,
        "is_rotation",
        "Checks if one string is a rotation of another string.",
        [P("str1", STR, "The first string."), P("str2", STR, "The second string.")],
        _rotation,
        "Check if '{str2}' is a rotation of '{str1}'.",
        "Determine whether '{str1}' and '{str2}' are rotations of each other.",
        "Tell me if the string '{str2}' is a rotated version of '{str1}'.",
    ),
    _tool(
        _E,
        "is_valid_ip_address",
        "Checks if a string is a valid IP address (IPv4).",
        [P("ip", STR, "The string to check.")],
        lambda r: {"ip": _ip(r, valid=r.random() < 0.6)},
        "Check if '{ip}' is a valid IPv4 address.",
        "Validate the IP address {ip}.",
        "Determine whether {ip} is a valid IP address.",
    ),
    _tool(
        _E,
        "monthly_mortgage_payment",
        "Calculates the monthly mortgage payment based on the loan amount, annual interest rate, and loan term.",
        [
            P("loan_amount", NUM, "The amount of the loan."),
            P("annual_interest_rate", NUM, "The annual rate."),
            P("loan_term_years", INT, "The loan term in years."),
        ],
        lambda r: {
            "loan_amount": r.randrange(100000, 800001, 5000),
            "annual_interest_rate": round(r.uniform(0.02, 0.08), 3),
            "loan_term_years": r.choice([10, 15, 20, 25, 30]),
        },
        "Calculate the monthly mortgage payment for a loan of ${loan_amount} at an annual interest rate of "
        "{annual_interest_rate} over {loan_term_years} years.",
        "Compute the monthly payment on a {loan_term_years}-year mortgage of {loan_amount} with an annual rate of "
        "{annual_interest_rate}.",
        "Work out what I would pay each month for a ${loan_amount} loan at {annual_interest_rate} annual interest "
        "for {loan_term_years} years.",
    ),
    _tool(
        _E,
        "reverse_string",
        "Reverses the characters in a string.",
        [P("text", STR, "The input string.")],
        lambda r: {"text": r.choice([r.choice(WORDS), _phrase(r)])},
        "Reverse the string '{text}'.",
        "Write '{text}' backwards.",
        "Give me the characters of '{text}' in reverse order.",
    ),
    _tool(
        _E,
        "solve_quadratic",
        "Computes the roots of a quadratic equation given its coefficients.",
        [P("a", NUM, "The coefficient of x^2."), P("b", NUM, "The coefficient of x."), P("c", NUM, "The constant.")],
        _quadratic,
        "Solve the quadratic equation with coefficients a={a}, b={b} and c={c}.",
        "Find the roots of {a}x^2 + {b}x + {c} = 0.",
        "Compute the roots of the quadratic with a = {a}, b = {b} and c = {c}.",
    ),
    # Adaptation tools: held out from evaluation, in the same style.
    _tool(
        _A,
        "is_armstrong_number",
        "Checks if a number is an Armstrong (narcissistic) number.",
        [P("num", INT, "The number to check.")],
        lambda r: {"num": r.choice(ARMSTRONG) if r.random() < 0.5 else r.randint(100, 9999)},
        "Check if {num} is an Armstrong number.",
        "Determine whether {num} is a narcissistic number.",
        "Tell me if {num} is an Armstrong number.",
    ),
    _tool(
        _A,
        "is_perfect_square",
        "Checks if a number is a perfect square.",
        [P("num", INT, "The number to check.")],
        lambda r: {"num": r.randint(2, 100) ** 2 if r.random() < 0.5 else r.randint(2, 10000)},
        "Check if {num} is a perfect square.",
        "Determine whether {num} is the square of an integer.",
        "Tell me if {num} is a perfect square.",
    ),
    _tool(
        _A,
        "prime_factorization",
        "Computes the prime factorization of a positive integer.",
        [P("number", INT, "The positive integer.")],
        lambda r: {"number": r.randint(2, 5000)},
        "Find the prime factors of {number}.",
        "Compute the prime factorization of {number}.",
        "Break {number} down into its prime factors.",
    ),
    _tool(
        _A,
        "calculate_distance",
        "Calculates the Euclidean distance between two points.",
        [
            P("point1", array_of(NUM), "The coordinates of the first point."),
            P("point2", array_of(NUM), "The coordinates of the second point."),
        ],
        _points,
        "Calculate the Euclidean distance between the points {point1} and {point2}.",
        "Find the distance from {point1} to {point2}.",
        "Compute how far apart the points {point1} and {point2} are.",
    ),
    _tool(
        _A,
        "triangle_area",
        "Computes the area of a triangle given its base and height.",
        [P("base", NUM, "The length of the base."), P("height", NUM, "The height.")],
        lambda r: {"base": round(r.uniform(1, 50), 1), "height": round(r.uniform(1, 50), 1)},
        "Calculate the area of a triangle with base {base} and height {height}.",
        "Find the area of a triangle whose base is {base} and whose height is {height}.",
        "Compute the triangle area for a base of {base} and a height of {height}.",
    ),
    _tool(
        _A,
        "circle_area",
        "Computes the area of a circle given its radius.",
        [P("radius", NUM, "The radius of the circle.")],
        lambda r: {"radius": round(r.uniform(0.5, 20), 1)},
        "Calculate the area of a circle with radius {radius}.",
        "Find the area of a circle whose radius is {radius}.",
        "Compute the area enclosed by a circle of radius {radius}.",
    ),
    _tool(
        _A,
        "compound_interest",
        "Calculates the compound interest of an investment.",
        [
            P("principal", NUM, "The initial investment."),
            P("rate", NUM, "The annual interest rate."),
            P("time", NUM, "The time in years."),
            P("n", INT, "The number of times interest is compounded per year (default 1).", required=False),
        ],
        lambda r: {
            "principal": r.randrange(1000, 50001, 500),
            "rate": round(r.uniform(0.01, 0.1), 3),
            "time": r.randint(1, 30),
            "n": r.choice([1, 4, 12, 365]),
        },
        "Calculate the compound interest on ${principal} at an annual rate of {rate} for {time} years.",
        "Compute the final amount of a {principal} investment at a {rate} annual rate over {time} years, "
        "compounded {n} times a year.",
        "Work out how much ${principal} grows to at {rate} interest over {time} years with {n} compounding "
        "periods per year.",
    ),
    _tool(
        _A,
        "calculate_age",
        "Calculates the age based on the birthdate.",
        [P("birthdate", STR, "The birthdate in the format 'YYYY-MM-DD'.")],
        lambda r: {"birthdate": _date(r, 1940, 2015).isoformat()},
        "Calculate the age of someone born on {birthdate}.",
        "Find out how old a person born on {birthdate} is.",
        "Compute the age for the birthdate {birthdate}.",
    ),
    _tool(
        _A,
        "count_vowels",
        "Counts the number of vowels in a given text.",
        [P("text", STR, "The input text.")],
        lambda r: {"text": _phrase(r)},
        "Count the vowels in '{text}'.",
        "Find how many vowels the text '{text}' contains.",
        "Tell me the number of vowels in '{text}'.",
    ),
    _tool(
        _A,
        "word_frequency",
        "Calculates the frequency of each word in a text.",
        [P("text", STR, "The input text.")],
        lambda r: {"text": _repetitive_phrase(r)},
        "Calculate the frequency of each word in '{text}'.",
        "Count how often every word occurs in '{text}'.",
        "Give me the word frequencies of the text '{text}'.",
    ),
    _tool(
        _A,
        "find_missing_number",
        "Finds the missing number in a list of integers from 0 to n.",
        [P("nums", array_of(INT), "The list of integers.")],
        _missing_number,
        "Find the missing number in the list {nums}.",
        "Identify which number from 0 to n is missing in {nums}.",
        "Determine the missing value in the sequence {nums}.",
    ),
    _tool(
        _A,
        "find_n_largest_numbers",
        "Finds the n largest numbers in a list.",
        [P("nums", array_of(INT), "The list of numbers."), P("n", INT, "The number of largest numbers to find.")],
        lambda r: {"nums": _ints(r, 1, 100), "n": r.randint(1, 3)},
        "Find the {n} largest numbers in {nums}.",
        "Get the top {n} values from the list {nums}.",
        "Return the {n} biggest numbers of {nums}.",
    ),
    _tool(
        _A,
        "merge_sorted_lists",
        "Merges two sorted lists into a single sorted list.",
        [P("list1", array_of(INT), "The first sorted list."), P("list2", array_of(INT), "The second sorted list.")],
        lambda r: {"list1": _sorted_ints(r, (3, 5)), "list2": _sorted_ints(r, (3, 5))},
        "Merge the sorted lists {list1} and {list2}.",
        "Combine the sorted lists {list1} and {list2} into one sorted list.",
        "Merge {list1} with {list2}, keeping the result sorted.",
    ),
    _tool(
        _A,
        "remove_duplicates",
        "Removes duplicate elements from a list while preserving the order.",
        [P("lst", array_of(INT), "The input list.")],
        _with_repeats,
        "Remove the duplicates from {lst}.",
        "Drop the repeated elements of the list {lst}.",
        "Give me {lst} without duplicates.",
    ),
    _tool(
        _A,
        "is_anagram",
        "Checks if two words are anagrams of each other.",
        [P("word1", STR, "The first word."), P("word2", STR, "The second word.")],
        _anagram,
        "Check if '{word1}' and '{word2}' are anagrams.",
        "Determine whether '{word1}' is an anagram of '{word2}'.",
        "Tell me if the words '{word1}' and '{word2}' are anagrams of each other.",
    ),
    _tool(
        _A,
        "get_range",
        "Helper function to format the range string.",
        [P("start", INT, "The start of the range."), P("end", INT, "The end of the range.")],
        _range,
        "Format the range from {start} to {end} as a string.",
        "Give me the range string for a start of {start} and an end of {end}.",
        "Create a range string from {start} to {end}.",
    ),
    _tool(
        _A,
        "split_list",
        "Splits a list into chunks of a specified size.",
        [P("lst", array_of(INT), "The input list."), P("chunk_size", INT, "The size of each chunk.")],
        lambda r: {"lst": _ints(r, 1, 50, (6, 10)), "chunk_size": r.randint(2, 4)},
        "Split the list {lst} into chunks of size {chunk_size}.",
        "Divide {lst} into chunks of {chunk_size} elements.",
        "Break {lst} up into groups of {chunk_size}.",
    ),
    _tool(
        _A,
        "average",
        "Calculates the arithmetic mean of a list of numbers.",
        [P("numbers", array_of(NUM), "The list of numbers.")],
        lambda r: {"numbers": _floats(r, 0, 100)},
        "Calculate the average of {numbers}.",
        "Find the arithmetic mean of the numbers {numbers}.",
        "Compute the mean of {numbers}.",
    ),
    _tool(
        _A,
        "std_deviation",
        "Calculates the standard deviation of a list of numbers.",
        [P("numbers", array_of(NUM), "The list of numbers.")],
        lambda r: {"numbers": _floats(r, 0, 50)},
        "Calculate the standard deviation of {numbers}.",
        "Find the standard deviation of the list {numbers}.",
        "Compute how spread out {numbers} are as a standard deviation.",
    ),
    _tool(
        _A,
        "light_travel_time",
        "Calculates the time taken for light to travel a given distance in light years.",
        [P("distance_in_light_years", NUM, "The distance in light years.")],
        lambda r: {"distance_in_light_years": round(r.uniform(1, 100), 1)},
        "Calculate how long light takes to travel {distance_in_light_years} light years.",
        "Find the travel time of light over a distance of {distance_in_light_years} light years.",
        "Compute the time it takes light to cross {distance_in_light_years} light years.",
    ),
    _tool(
        _A,
        "bacterial_growth",
        "Calculates the bacterial population after a given time.",
        [
            P("initial_population", INT, "The initial population."),
            P("growth_rate", NUM, "The growth rate."),
            P("time", NUM, "The time elapsed."),
        ],
        lambda r: {
            "initial_population": r.randrange(10, 1001, 10),
            "growth_rate": round(r.uniform(0.05, 0.5), 2),
            "time": r.randint(1, 48),
        },
        "Calculate the bacterial population after {time} hours, starting from {initial_population} with a growth "
        "rate of {growth_rate}.",
        "Find how many bacteria there are after {time} hours if {initial_population} bacteria grow at a rate of "
        "{growth_rate}.",
        "Compute the population of a culture of {initial_population} bacteria after {time} hours at a growth rate "
        "of {growth_rate}.",
    ),
    _tool(
        _A,
        "dice_roll_probability",
        "Calculates the probability of rolling a specific sum with a number of dice.",
        [
            P("target_sum", INT, "The target sum."),
            P("num_dice", INT, "The number of dice."),
            P("num_faces", INT, "The number of faces on each die (default 6).", required=False),
        ],
        _dice,
        "Calculate the probability of rolling a sum of {target_sum} with {num_dice} dice.",
        "Find the probability that {num_dice} dice with {num_faces} faces add up to {target_sum}.",
        "Compute the chance of a total of {target_sum} when rolling {num_dice} {num_faces}-sided dice.",
    ),
    _tool(
        _A,
        "get_ip_location",
        "Retrieves the latitude and longitude coordinates of a given IP address.",
        [P("ip", STR, "The IP address.")],
        lambda r: {"ip": _ip(r)},
        "Get the location of the IP address {ip}.",
        "Find where the IP {ip} is located.",
        "Look up the geographic coordinates of {ip}.",
    ),
    _tool(
        _A,
        "is_subset",
        "Checks if one set is a subset of another set.",
        [P("set1", array_of(INT), "The first set."), P("set2", array_of(INT), "The second set.")],
        _subset,
        "Check if {set1} is a subset of {set2}.",
        "Determine whether every element of {set1} is in {set2}.",
        "Tell me if {set1} is contained in {set2}.",
    ),
    _tool(
        _A,
        "find_peak_element",
        "Finds a peak element in a list of integers.",
        [P("nums", array_of(INT), "The list of integers.")],
        _peak,
        "Find a peak element in the list {nums}.",
        "Identify a peak in {nums}.",
        "Locate an element of {nums} that is larger than its neighbours.",
    ),
)
TOOLS: dict[str, Tool] = {t.name: t for t in _ALL}


def split_tools() -> tuple[list[str], list[str]]:
    """(adaptation tool names, evaluation tool names): disjoint halves of the built-in catalog."""
    return ([t.name for t in _ALL if t.group == ADAPTATION], [t.name for t in _ALL if t.group == EVALUATION])


def resolve(tools) -> list[Tool]:
    """Tools given by built-in name or as ``Tool`` objects (to extend the catalog)."""
    unknown = [t for t in tools if isinstance(t, str) and t not in TOOLS]
    if unknown:
        raise DataError(f"unknown built-in tool(s): {', '.join(unknown)} (see tokmem.data.tool_catalog.TOOLS)")
    return [TOOLS[t] if isinstance(t, str) else t for t in tools]


def catalog(tools=None) -> dict[str, dict]:
    """Tool name → JSON-schema signature (name, description, parameters), for ICL/RAG prompts."""
    return {t.name: t.schema() for t in resolve(TOOLS if tools is None else tools)}
