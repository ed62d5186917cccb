"""The three travel tools the example clients give the agent: their OpenAI schemas and local fake implementations.

The schemas are the ``travel`` bank's training catalog (``catalog.json``): parameter names and their order must
match it, or ``tokmem serve`` refuses the request naming the parameter the bank never learned.  Every
parameter is required and no other is allowed, so the schemas are also valid ``strict`` schemas.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


CATALOG = Path(__file__).with_name("catalog.json")  # what the bank was trained with: one definition of the tools


def _strict(entry: dict) -> dict:
    """A catalog entry as an OpenAI tool whose schema is also a valid ``strict`` one (every key required, no other)."""
    parameters = {**entry["parameters"], "additionalProperties": False}
    parameters["required"] = list(parameters["properties"])
    return {"type": "function", "function": {**entry, "parameters": parameters}}


TOOLS = [_strict(entry) for entry in json.loads(CATALOG.read_text())]


def client_arguments(description: str, argv: list[str] | None = None) -> argparse.Namespace:
    """The options every example client takes: where the server is, which bank, and the question."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default="travel", help="the bank (or banks joined by '+')")
    parser.add_argument("--api-key", default="unused", help="the server's --api-key, if it has one")
    parser.add_argument("--question", default="Tell me the current temperature in Lisbon (celsius).")
    return parser.parse_args(argv)


def get_weather(city: str, unit: str = "celsius") -> dict:
    celsius = 12 + sum(map(ord, city)) % 18
    return {"city": city, "temperature": celsius if unit == "celsius" else round(celsius * 9 / 5 + 32), "unit": unit}


RATES = {"EUR": 1.0, "USD": 1.08, "GBP": 0.85, "JPY": 162.0, "CHF": 0.95}  # per euro


def convert_currency(amount: float, from_: str, to: str) -> dict:
    rate = RATES.get(to.upper(), 1.0) / RATES.get(from_.upper(), 1.0)
    return {"amount": amount, "from": from_, "to": to, "converted": round(amount * rate, 2)}


def search_flights(origin: str, destination: str, date: str) -> dict:
    return {"flights": [{"from": origin, "to": destination, "date": date, "departs": "09:40", "price_eur": 129}]}


def run_tool(name: str, arguments: dict) -> str:
    """A tool call's result as JSON text (an error message for a call the tools cannot take)."""
    try:
        if name == "convert_currency":  # "from" is a Python keyword
            arguments = {("from_" if key == "from" else key): value for key, value in arguments.items()}
        result = {"get_weather": get_weather, "convert_currency": convert_currency, "search_flights": search_flights}[
            name
        ](**arguments)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        result = {"error": f"{name} cannot take {arguments}: {error}"}
    return json.dumps(result)
