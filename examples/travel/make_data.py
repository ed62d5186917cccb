"""Writes this folder's example data: three travel tools (catalog.json) and queries that call them with the tools'
results (train.jsonl, heldout.jsonl), in tokmem's procedure format.  Seeded: running it again writes the same files.

    python examples/travel/make_data.py

Each example is one call (a few are two: a flight search, then its price converted), with the result a real tool
would return; about a third close with an answer in words after the result.  The training queries are drawn from
templates; the held-out ones are written by hand apart from them (``HELDOUT_*``: phrasings the bank never saw).
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

# A tool's training phrasings: plain, terse, indirect.  The last ones of each list (weather asked through what to do
# outdoors, codes in lower case, a priced flight that names its currency first) came after the held-out misses of the
# first 160-example data were read, written from scratch for the kinds of phrasing it lacked: none rewords a held-out
# query.
WEATHER = [
    "What's the weather in {city}?",
    "How warm is it in {city} right now, in {unit}?",
    "Is it raining in {city}?",
    "weather {city}",
    "Tell me the current temperature in {city} ({unit}).",
    "I'm packing for {city}: what's it like there today?",
    "Do I need a jacket in {city} today?",
    "Give me the forecast for {city} in {unit}, please.",
    "{city} weather today",
    "temperature {city} {unit}",
    "What clothes do I pack for {city}? Check the weather there.",
    "Is it T-shirt weather in {city}?",
    "I fly to {city} tonight; how warm is it there?",
    "Will I be cold in {city}? Give me the temperature in {unit}.",
    "Current conditions for {city}, please.",
    "Sun or clouds in {city} today?",
    "I'm visiting {city} next week; what weather should I expect?",
    "Packing list for {city}: do I need warm clothes?",
    "weather check {city}",
    "Outside temperature in {city}?",
    "Planning a walk around {city} - what's the sky like?",
    "How many degrees is it in {city} ({unit})?",
    "Any snow falling in {city} right now?",
    "Is it a beach day in {city}?",
    "Would a light sweater be enough in {city} today?",
    "My friend in {city} says it's stormy - can you look?",
    "Can I go for a run outdoors in {city} now?",
    "How humid is it in {city} today?",
    "I land in {city} at noon; is it freezing there?",
    "Look up the skies over {city} for me, in {unit}.",
    "Picnic in {city} today: good idea, weather-wise?",
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
    "convert {amount} {from} {to}",
    "{from}->{to} {amount}",
    "What's the price of {amount} {from} in {to_name}?",
    "This costs {amount} {from_name}. How much is that in {to_name}?",
    "Rate me {amount} {from} against {to}.",
    "My budget is {amount} {from_name}; what is it in {to_name}?",
    "Paying {amount} {from} in {to}: how much?",
    "Is {amount} {from} expensive in {to_name} terms?",
    "{amount} {from} = ? {to}",
    "Going abroad with {amount} {from_name}: how much {to_name} is it?",
    "How much money is {amount} {from} in {to_name}?",
    "I'll spend {amount} {from_name} - what's that in {to}?",
    "Work out {amount} {from} in {to} for me.",
    "{from_lower} {amount} to {to_lower}",
    "how much {to_lower} is {amount} {from_lower}",
    "{amount} {from_lower} -> {to_lower}?",
    "Need {to_name}: how much for {amount} {from}?",
    "Dinner came to {amount} {from}; in {to_name} please.",
    "rate {from_lower}/{to_lower} on {amount}",
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
    "{origin} to {destination} {date} flights",
    "plane {origin} {destination} {date}",
    "{origin} {destination} {date} flight?",
    "I'd like to fly out of {origin} to {destination} on {date}.",
    "Flights to {destination} on {date}? I'm in {origin}.",
    "Ticket options {origin} to {destination}, {date}.",
    "Going from {origin} to {destination} on {date}: what can I fly?",
    "air travel {origin} {destination} {date}",
    "Any seats left {origin} to {destination} on {date}?",
    "Hop from {origin} over to {destination} on {date} - what's flying?",
]
PRICED = [
    "Find a flight from {origin} to {destination} on {date} and tell me the price in {to}.",
    "How much in {to_name} is the cheapest flight {origin} to {destination} on {date}?",
    "Cheapest way to fly {origin} to {destination} on {date}, in {to_name}?",
    "{origin} to {destination} on {date}: flight price in {to}?",
    "Price a flight {origin}-{destination} for {date} in {to}.",
    "Flying {origin} to {destination} on {date}; how many {to_name} is the ticket?",
    "Book {origin} to {destination} on {date} and quote me the total in {to_name}.",
    "Flights {origin} {destination} {date}, costs in {to}",
    "In {to_name}, what's the fare from {origin} to {destination} on {date}?",
    "Convert the fare of a {origin}-{destination} flight on {date} into {to}.",
    "How much {to} will I pay to fly {origin} to {destination} on {date}?",
    "Cost in {to_name} of flying {origin} to {destination} on {date}?",
    "I budget in {to}: look up {origin} to {destination} for {date} and its price.",
]

# The held-out queries, written by hand apart from the templates above (before the second half of each list, none
# copied into it), as a user would ask them: a fair test of phrasings the bank never trained on.  Each with the
# values its call should carry.
HELDOUT_WEATHER = [
    ("Should I bring an umbrella to Dublin tomorrow?", "Dublin", "celsius"),
    ("what's the temperature like in Tokyo at the moment", "Tokyo", "celsius"),
    ("Oslo weather now, fahrenheit", "Oslo", "fahrenheit"),
    ("Is it hot in Cairo today?", "Cairo", "celsius"),
    ("Going to Seoul this afternoon - will it be cold?", "Seoul", "celsius"),
    ("What should I wear in Paris today?", "Paris", "celsius"),
    ("temp in Madrid in F", "Madrid", "fahrenheit"),
    ("Could you check the conditions in Nairobi for me?", "Nairobi", "celsius"),
    ("How's the weather looking in Rome?", "Rome", "celsius"),
    ("Lima: sunny or not?", "Lima", "celsius"),
    ("Will I need sunglasses in Berlin this morning?", "Berlin", "celsius"),
    ("I'm heading to Lisbon later, what's it doing outside there in celsius?", "Lisbon", "celsius"),
]
HELDOUT_CURRENCY = [
    ("What's 60 dollars in euros?", 60, "USD", "EUR"),
    ("How many yen do I get for 300 pounds?", 300, "GBP", "JPY"),
    ("Convert 45.5 CHF into EUR please", 45.5, "CHF", "EUR"),
    ("200 euros in pounds?", 200, "EUR", "GBP"),
    ("whats the USD value of 1500 JPY", 1500, "JPY", "USD"),
    ("Turn 80 GBP into Swiss francs.", 80, "GBP", "CHF"),
    ("I want to exchange 500 dollars for yen, how much would I receive?", 500, "USD", "JPY"),
    ("How much would 120 euros be in US dollars?", 120, "EUR", "USD"),
    ("Is 1000 yen a lot? Tell me in euros.", 1000, "JPY", "EUR"),
    ("eur to usd, 350", 350, "EUR", "USD"),
    ("My hotel costs 90 pounds a night. What is that in euros?", 90, "GBP", "EUR"),
    ("Quick conversion: 25 CHF -> USD", 25, "CHF", "USD"),
]
HELDOUT_FLIGHTS = [
    ("Is there a plane from Madrid to Rome on 2026-07-03?", "Madrid", "Rome", "2026-07-03"),
    ("Show me flights leaving Berlin for Tokyo on 2026-08-15.", "Berlin", "Tokyo", "2026-08-15"),
    ("Dublin to Paris, 2026-06-20, what flights are there?", "Dublin", "Paris", "2026-06-20"),
    ("I want to travel by air from Seoul to Lima on 2026-09-09.", "Seoul", "Lima", "2026-09-09"),
    ("Look up flights Cairo -> Oslo 2026-07-30", "Cairo", "Oslo", "2026-07-30"),
    ("Any departures from Lisbon heading to Nairobi on 2026-06-12?", "Lisbon", "Nairobi", "2026-06-12"),
    ("Need a flight, Rome to Madrid, 2026-08-01", "Rome", "Madrid", "2026-08-01"),
    ("Which airlines fly Oslo to Berlin on 2026-09-18?", "Oslo", "Berlin", "2026-09-18"),
    ("Get me flight options from Paris to Seoul for 2026-07-07.", "Paris", "Seoul", "2026-07-07"),
    ("Fly Tokyo-Dublin 2026-06-29", "Tokyo", "Dublin", "2026-06-29"),
    ("What's available from Nairobi to Lisbon by air on 2026-08-22?", "Nairobi", "Lisbon", "2026-08-22"),
    ("Check flights between Lima and Cairo on 2026-09-03, departing Lima.", "Lima", "Cairo", "2026-09-03"),
]
HELDOUT_PRICED = [
    (
        "What would a flight from Berlin to Lisbon on 2026-07-14 cost me in dollars?",
        "Berlin",
        "Lisbon",
        "2026-07-14",
        "USD",
    ),
    ("Search flights Oslo to Rome on 2026-08-08 and convert the fare to pounds.", "Oslo", "Rome", "2026-08-08", "GBP"),
    ("Flight Madrid to Tokyo 2026-06-16, price in yen please.", "Madrid", "Tokyo", "2026-06-16", "JPY"),
    ("I'm paid in CHF: how much is a ticket from Paris to Cairo on 2026-09-21?", "Paris", "Cairo", "2026-09-21", "CHF"),
]


def call(name: str, arguments: dict) -> str:
    return json.dumps({"name": name, "arguments": arguments}, separators=(",", ":"))


def weather(rng: random.Random) -> dict:
    template, city = rng.choice(WEATHER), rng.choice(CITIES)
    unit = rng.choice(["celsius", "fahrenheit"]) if "{unit}" in template else "celsius"  # unsaid: celsius
    return weather_example(rng, template.format(city=city, unit=unit), city, unit)


def weather_example(rng: random.Random, query: str, city: str, unit: str) -> dict:
    degrees = rng.randint(5, 32) if unit == "celsius" else rng.randint(41, 90)
    conditions = rng.choice(CONDITIONS)
    result = {"city": city, "temperature": degrees, "unit": unit, "conditions": conditions}
    return {
        "query": query,
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
    names = dict(
        from_name=CURRENCIES[source], to_name=CURRENCIES[target], from_lower=source.lower(), to_lower=target.lower()
    )
    query = rng.choice(CURRENCY).format(amount=amount, **{"from": source, "to": target}, **names)
    return currency_example(query, amount, source, target)


def currency_example(query: str, amount: float, source: str, target: str) -> dict:
    value = converted(amount, source, target)
    arguments = {"amount": amount, "from": source, "to": target}
    return {
        "query": query,
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
    query = rng.choice(FLIGHTS).format(origin=origin, destination=destination, date=date)
    return flights_example(rng, query, origin, destination, date)


def flights_example(rng: random.Random, query: str, origin: str, destination: str, date: str) -> dict:
    result, price = flight_result(rng, origin, destination, date)
    arguments = {"origin": origin, "destination": destination, "date": date}
    return {
        "query": query,
        "steps": [
            {"procedure": "search_flights", "response": call("search_flights", arguments), "result": json.dumps(result)}
        ],
        "answer": f"Flight {result['flights'][0]['flight']} from {origin} to {destination} on {date}: {price} EUR.",
    }


def priced_flight(rng: random.Random) -> dict:
    """Two calls: the search, then its price converted (the second call's arguments come from the first result)."""
    origin, destination, date = trip(rng)
    target = rng.choice(["USD", "GBP", "JPY", "CHF"])
    query = rng.choice(PRICED).format(
        origin=origin, destination=destination, date=date, to=target, to_name=CURRENCIES[target]
    )
    return priced_flight_example(rng, query, origin, destination, date, target)


def priced_flight_example(
    rng: random.Random, query: str, origin: str, destination: str, date: str, target: str
) -> dict:
    result, price = flight_result(rng, origin, destination, date)
    value = converted(price, "EUR", target)
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
    """``count`` examples, each tool first in a third of them (every other flight search priced: a priced flight
    begins with the search, so a search_flights row trained on every priced flight besides its own queries routes
    the other tools' queries to itself); a third keep their answer."""
    makers = [weather, currency, flights, weather, currency, priced_flight]
    out = []
    for k in range(count):
        example = makers[k % len(makers)](rng)
        if rng.random() >= 1 / 3:
            del example["answer"]
        out.append({"id": f"{prefix}-{k}", **example})
    return out


def heldout(rng: random.Random) -> list[dict]:
    """The hand-written held-out queries (``HELDOUT_*``) as examples, the tools in turn, the two-call ones last."""
    made = [
        example
        for rows in zip(HELDOUT_WEATHER, HELDOUT_CURRENCY, HELDOUT_FLIGHTS)
        for example in (
            weather_example(rng, *rows[0]),
            currency_example(*rows[1]),
            flights_example(rng, *rows[2]),
        )
    ]
    made += [priced_flight_example(rng, *row) for row in HELDOUT_PRICED]
    return [{"id": f"heldout-{k}", **example} for k, example in enumerate(made)]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", type=int, default=160)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    (HERE / "catalog.json").write_text(json.dumps(CATALOG, indent=2) + "\n", encoding="utf-8")
    write_jsonl(HERE / "train.jsonl", examples(rng, args.train, "train"))
    held_out = heldout(random.Random(args.seed + 1))
    write_jsonl(HERE / "heldout.jsonl", held_out)
    print(f"wrote {HERE / 'catalog.json'}, {args.train} training and {len(held_out)} held-out examples")


if __name__ == "__main__":
    main()
