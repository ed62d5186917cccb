"""Writes this folder's example data: three travel tools (catalog.json) and queries that call them with the tools'
results (train.jsonl, heldout.jsonl), in tokmem's procedure format.  Seeded: running it again writes the same files.

    python examples/travel/make_data.py

Each example is one call (a few are two: a flight search, then its price converted), with the result a real tool
would return; about a third close with an answer in words after the result.  The held-out queries use the same
phrasings with other values (``--heldout`` of them, drawn after the training ones).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

HERE = Path(__file__).parent

CATALOG = [
    {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Lisbon"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
    {
        "name": "convert_currency",
        "description": "Convert an amount of money from one currency to another.",
        "parameters": {
            "type": "object",
            "properties": {
                "amount": {"type": "number"},
                "from": {"type": "string", "description": "ISO 4217 code, e.g. EUR"},
                "to": {"type": "string", "description": "ISO 4217 code, e.g. USD"},
            },
            "required": ["amount", "from", "to"],
        },
    },
    {
        "name": "search_flights",
        "description": "Search flights between two cities on a date.",
        "parameters": {
            "type": "object",
            "properties": {
                "origin": {"type": "string"},
                "destination": {"type": "string"},
                "date": {"type": "string", "description": "YYYY-MM-DD"},
            },
            "required": ["origin", "destination", "date"],
        },
    },
]

CITIES = ["Lisbon", "Paris", "Rome", "Tokyo", "Cairo", "Oslo", "Madrid", "Berlin", "Nairobi", "Lima", "Seoul", "Dublin"]
CURRENCIES = {"EUR": "euros", "USD": "dollars", "GBP": "pounds", "JPY": "yen", "CHF": "Swiss francs"}
CONDITIONS = ["sunny", "cloudy", "light rain", "windy", "clear"]
RATES = {"EUR": 1.0, "USD": 1.08, "GBP": 0.86, "JPY": 162.0, "CHF": 0.95}

WEATHER = [
    "What's the weather in {city}?",
    "How warm is it in {city} right now, in {unit}?",
    "Is it raining in {city}?",
    "weather {city}",
    "Tell me the current temperature in {city} ({unit}).",
    "I'm packing for {city}: what's it like there today?",
    "Do I need a jacket in {city} today?",
    "Give me the forecast for {city} in {unit}, please.",
]
CURRENCY = [
    "Convert {amount} {from_name} to {to_name}.",
    "How much is {amount} {from} in {to}?",
    "What are {amount} {from_name} worth in {to_name}?",
    "{amount} {from} to {to}",
    "I have {amount} {from_name}; how many {to_name} is that?",
    "Change {amount} {from} into {to} for me.",
    "exchange {amount} {from_name} -> {to_name}",
    "If I swap {amount} {from} for {to}, what do I get?",
]
FLIGHTS = [
    "Find flights from {origin} to {destination} on {date}.",
    "Are there any flights {origin} to {destination} on {date}?",
    "I need to fly from {origin} to {destination} on {date}.",
    "flights {origin} {destination} {date}",
    "Book me something from {origin} to {destination}, leaving {date}.",
    "What flights go to {destination} from {origin} on {date}?",
    "Search {origin} -> {destination} for {date}.",
    "Can I get from {origin} to {destination} by plane on {date}?",
]
PRICED = [
    "Find a flight from {origin} to {destination} on {date} and tell me the price in {to}.",
    "How much in {to_name} is the cheapest flight {origin} to {destination} on {date}?",
]


def call(name: str, arguments: dict) -> str:
    return json.dumps({"name": name, "arguments": arguments}, separators=(",", ":"))


def weather(rng: random.Random) -> dict:
    template, city = rng.choice(WEATHER), rng.choice(CITIES)
    unit = rng.choice(["celsius", "fahrenheit"]) if "{unit}" in template else "celsius"  # unsaid: celsius
    degrees = rng.randint(5, 32) if unit == "celsius" else rng.randint(41, 90)
    conditions = rng.choice(CONDITIONS)
    result = {"city": city, "temperature": degrees, "unit": unit, "conditions": conditions}
    return {
        "query": template.format(city=city, unit=unit),
        "steps": [
            {
                "procedure": "get_weather",
                "response": call("get_weather", {"city": city, "unit": unit}),
                "result": json.dumps(result),
            }
        ],
        "answer": f"It is {degrees}° {unit} and {conditions} in {city}.",
    }


def amount_and_pair(rng: random.Random) -> tuple[int, str, str]:
    source, target = rng.sample(sorted(CURRENCIES), 2)
    return rng.choice([20, 50, 75, 100, 250, 300, 1200, 5000]), source, target


def converted(amount: float, source: str, target: str) -> float:
    return round(amount / RATES[source] * RATES[target], 2)


def currency(rng: random.Random) -> dict:
    amount, source, target = amount_and_pair(rng)
    value = converted(amount, source, target)
    names = dict(from_name=CURRENCIES[source], to_name=CURRENCIES[target])
    arguments = {"amount": amount, "from": source, "to": target}
    return {
        "query": rng.choice(CURRENCY).format(amount=amount, **{"from": source, "to": target}, **names),
        "steps": [
            {
                "procedure": "convert_currency",
                "response": call("convert_currency", arguments),
                "result": json.dumps({"amount": value, "currency": target}),
            }
        ],
        "answer": f"{amount} {source} is {value} {target}.",
    }


def flight_result(rng: random.Random, origin: str, destination: str, date: str) -> tuple[dict, int]:
    price = rng.randint(90, 900)
    code = f"{origin[:2].upper()}{rng.randint(100, 999)}"
    flight = {
        "flight": code,
        "origin": origin,
        "destination": destination,
        "date": date,
        "price": price,
        "currency": "EUR",
        "departs": f"{rng.randint(6, 21):02d}:{rng.choice(['05', '20', '45'])}",
    }
    return {"flights": [flight]}, price


def trip(rng: random.Random) -> tuple[str, str, str]:
    origin, destination = rng.sample(CITIES, 2)
    return origin, destination, f"2026-{rng.choice([6, 7, 8, 9]):02d}-{rng.randint(1, 28):02d}"


def flights(rng: random.Random) -> dict:
    origin, destination, date = trip(rng)
    result, price = flight_result(rng, origin, destination, date)
    arguments = {"origin": origin, "destination": destination, "date": date}
    return {
        "query": rng.choice(FLIGHTS).format(origin=origin, destination=destination, date=date),
        "steps": [
            {"procedure": "search_flights", "response": call("search_flights", arguments), "result": json.dumps(result)}
        ],
        "answer": f"Flight {result['flights'][0]['flight']} from {origin} to {destination} on {date}: {price} EUR.",
    }


def priced_flight(rng: random.Random) -> dict:
    """Two calls: the search, then its price converted (the second call's arguments come from the first result)."""
    origin, destination, date = trip(rng)
    target = rng.choice(["USD", "GBP", "JPY", "CHF"])
    result, price = flight_result(rng, origin, destination, date)
    value = converted(price, "EUR", target)
    query = rng.choice(PRICED).format(
        origin=origin, destination=destination, date=date, to=target, to_name=CURRENCIES[target]
    )
    search = {"origin": origin, "destination": destination, "date": date}
    conversion = {"amount": price, "from": "EUR", "to": target}
    return {
        "query": query,
        "steps": [
            {"procedure": "search_flights", "response": call("search_flights", search), "result": json.dumps(result)},
            {
                "procedure": "convert_currency",
                "response": call("convert_currency", conversion),
                "result": json.dumps({"amount": value, "currency": target}),
            },
        ],
        "answer": f"The flight costs {price} EUR, which is {value} {target}.",
    }


def examples(rng: random.Random, count: int, prefix: str) -> list[dict]:
    """``count`` examples, the three tools in turn (every tenth a priced flight); a third keep their answer."""
    makers = [weather, currency, flights]
    out = []
    for k in range(count):
        example = priced_flight(rng) if k % 10 == 9 else makers[k % 3](rng)
        if rng.random() >= 1 / 3:
            del example["answer"]
        out.append({"id": f"{prefix}-{k}", **example})
    return out


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", type=int, default=108)
    parser.add_argument("--heldout", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    (HERE / "catalog.json").write_text(json.dumps(CATALOG, indent=2) + "\n", encoding="utf-8")
    write_jsonl(HERE / "train.jsonl", examples(rng, args.train, "train"))
    write_jsonl(HERE / "heldout.jsonl", examples(rng, args.heldout, "heldout"))
    print(f"wrote {HERE / 'catalog.json'}, {args.train} training and {args.heldout} held-out examples")


if __name__ == "__main__":
    main()
