"""The three travel tools the example clients give the agent: their OpenAI schemas and local fake implementations.

The schemas are the ones the ``travel`` bank learned (its training catalog): parameter names and their order
must match it, or ``tokmem serve`` refuses the request naming the parameter the bank never learned.  Every
parameter is required and no other is allowed, so the schemas are also valid ``strict`` schemas.
"""

from __future__ import annotations

import json


def _function(name: str, description: str, properties: dict) -> dict:
    parameters = {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


TOOLS = [
    _function(
        "get_weather",
        "Current weather in a city.",
        {
            "city": {"type": "string", "description": "City name, e.g. Lisbon"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
    ),
    _function(
        "convert_currency",
        "Convert an amount of money from one currency to another.",
        {
            "amount": {"type": "number"},
            "from": {"type": "string", "description": "ISO 4217 code, e.g. EUR"},
            "to": {"type": "string", "description": "ISO 4217 code, e.g. USD"},
        },
    ),
    _function(
        "search_flights",
        "Search flights between two cities on a date.",
        {
            "origin": {"type": "string"},
            "destination": {"type": "string"},
            "date": {"type": "string", "description": "YYYY-MM-DD"},
        },
    ),
]


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
