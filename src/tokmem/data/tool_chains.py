"""Synthetic tool chains: records whose later calls read their values out of earlier calls' results.

An adaptation set in the tool loop's own format (a query, then calls each followed by its JSON result) that can be
made as large as wanted, over tools no real dataset here names.  What it teaches is what ComplexFuncBench's records
ask of a backbone reading a memory token: copy a value the user said (a city, a performer), write a value the user
said in words in the API's form (``November 15th, 2025`` → ``2025-11-15``, ``2 pm`` → ``14:00``, ``three`` → ``3``),
and copy an id or coordinates out of a result — the right item of several, picked as the query asks (the
best-rated, the earliest, the one by the performer named), from the last result or an older one.

Four families, 2–4 calls a record: dining (area → restaurants → reservation), trains (two stations → trains → seat
map), weather (place → forecast, sometimes air quality) and concerts (venue → events → ticket offers).
"""

from __future__ import annotations

import random
import string

from tokmem.data.procedures import Example
from tokmem.data.toolfiles import calls_example, result_text

CITIES = (
    "Lisbon", "Porto", "Valencia", "Seville", "Lyon", "Marseille", "Bordeaux", "Turin", "Bologna", "Naples", "Munich",
    "Hamburg", "Leipzig", "Vienna", "Graz", "Zurich", "Basel", "Prague", "Krakow", "Gdansk", "Budapest", "Ljubljana",
    "Zagreb", "Oslo", "Bergen", "Gothenburg", "Aarhus", "Helsinki", "Tallinn", "Riga", "Vilnius", "Dublin", "Cork",
    "Edinburgh", "Glasgow", "Manchester", "Leeds", "Antwerp", "Utrecht", "Rotterdam", "Osaka", "Kyoto", "Busan",
    "Melbourne", "Perth", "Auckland", "Toronto", "Montreal", "Denver", "Austin", "Portland", "Chicago",
)  # fmt: skip
CUISINES = ("Italian", "Thai", "Mexican", "Japanese", "Indian", "Greek", "Lebanese", "Vietnamese", "Spanish", "Korean")
NAME_WORDS = (
    "Golden", "Olive", "Harbor", "Copper", "Silver", "Garden", "Lantern", "Maple", "River", "Stone", "Blue", "Saffron",
    "Cedar", "Velvet", "Juniper", "Little", "Grand", "Old", "Red", "Wild", "North", "Corner", "Fig", "Pepper",
)  # fmt: skip
PLACES = ("Kitchen", "Table", "House", "Bistro", "Tavern", "Room", "Garden", "Cellar")
VENUES = ("Arena", "Hall", "Theatre", "Pavilion", "Amphitheatre", "Forum")
PERFORMERS = (
    "The Lumineers", "Arctic Monkeys", "Norah Jones", "Imagine Dragons", "Florence and the Machine", "Coldplay",
    "Hozier", "Lorde", "Bon Iver", "Tame Impala", "Khruangbin", "Phoebe Bridgers", "Vampire Weekend", "Fleet Foxes",
)  # fmt: skip
NUMBER_WORDS = ("one", "two", "three", "four", "five", "six", "seven", "eight")
MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November",
    "December",
)  # fmt: skip
TOOLS = frozenset(
    {
        "Find_Dining_Area",
        "Search_Restaurants",
        "Reserve_Table",
        "Search_Station",
        "Search_Trains",
        "Get_Train_Seat_Map",
        "Geocode_Place",
        "Get_Forecast",
        "Get_Air_Quality",
        "Search_Venue",
        "Search_Events",
        "Get_Ticket_Offers",
    }
)


def tool_chains(count: int, seed: int = 0) -> list[Example]:
    """``count`` records, each of a family drawn at random; the same ``seed`` gives the same records."""
    rng = random.Random(f"tool-chains:{seed}")
    families = (_dining, _trains, _weather, _concerts)
    return [
        calls_example(query, calls, f"chain-{k}", [result_text(r) for r in results])
        for k in range(count)
        for query, calls, results in [rng.choice(families)(rng)]
    ]


# ---- values a user says in words, and the API's form of them ------------------------------------------------


def _date(rng: random.Random) -> tuple[str, str, tuple[int, int, int]]:
    """(as said, ISO, (year, month, day)) of a date in 2025–2026."""
    year, month, day = rng.choice((2025, 2026)), rng.randint(1, 12), rng.randint(1, 28)
    said = rng.choice((f"{MONTHS[month - 1]} {day}{_ordinal(day)}, {year}", f"{day} {MONTHS[month - 1]} {year}"))
    return said, f"{year}-{month:02d}-{day:02d}", (year, month, day)


def _later(date: tuple[int, int, int], days: int) -> tuple[str, str]:
    """(as said, ISO) of ``days`` after ``date`` within its month's first 28 days (or the 28th)."""
    year, month, day = date
    day = min(28, day + days)
    return f"{MONTHS[month - 1]} {day}{_ordinal(day)}", f"{year}-{month:02d}-{day:02d}"


def _ordinal(day: int) -> str:
    return "th" if 10 < day % 100 < 14 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")


def _time(rng: random.Random) -> tuple[str, str]:
    """(as said, ``HH:MM``) of a time of day."""
    hour, minute = rng.randint(7, 21), rng.choice((0, 0, 15, 30, 45))
    clock = hour % 12 or 12
    said = f"{clock}{':%02d' % minute if minute else ''} {'am' if hour < 12 else 'pm'}"
    return said, f"{hour:02d}:{minute:02d}"


def _token(rng: random.Random, length: int = 10) -> str:
    return "".join(rng.choices(string.ascii_letters + string.digits, k=length))


def _coordinates(rng: random.Random) -> dict:
    return {"latitude": round(rng.uniform(-45, 65), 5), "longitude": round(rng.uniform(-125, 150), 5)}


def _name(rng: random.Random, kinds=PLACES) -> str:
    return f"{rng.choice(NAME_WORDS)} {rng.choice(NAME_WORDS)} {rng.choice(kinds)}"


# ---- the families: (query, [(tool, arguments)], [result]) ---------------------------------------------------


def _dining(rng: random.Random):
    city, cuisine, party = rng.choice(CITIES), rng.choice(CUISINES), rng.randint(2, 8)
    (said_date, date, _), (said_time, time) = _date(rng), _time(rng)
    area = {"area_id": f"ar_{rng.randint(10000, 99999)}", "name": city, "coordinates": _coordinates(rng)}
    other = {"area_id": f"ar_{rng.randint(10000, 99999)}", "name": f"{city} Airport", "coordinates": _coordinates(rng)}
    places = [
        {"restaurant_id": _token(rng), "name": _name(rng), "rating": tenths / 10}
        for tenths in rng.sample(range(30, 51), rng.randint(3, 5))  # no two rated alike: one is the best
    ]
    best = max(places, key=lambda p: p["rating"])
    query = rng.choice(
        (
            f"Book a table for {NUMBER_WORDS[party - 1]} at the best-rated {cuisine} restaurant in {city} on "
            f"{said_date} at {said_time}.",
            f"We are {NUMBER_WORDS[party - 1]} people and want {cuisine} food in {city} on {said_date}, {said_time}: "
            "reserve the highest rated place.",
        )
    )
    search = {"area_id": area["area_id"], "cuisine": cuisine, "date": date}
    calls = [
        ("Find_Dining_Area", {"query": city}),
        ("Search_Restaurants", search),
        ("Reserve_Table", {"restaurant_id": best["restaurant_id"], "date": date, "time": time, "party_size": party}),
    ]
    confirmation = {"reservation_id": _token(rng, 8), "status": "confirmed", "restaurant": best["name"]}
    return query, calls, [[area, other], {"restaurants": places}, confirmation]


def _trains(rng: random.Random):
    origin, destination = rng.sample(CITIES, 2)
    (said_date, date, _), (said_time, time) = _date(rng), _time(rng)
    stations = [
        [{"station_id": str(rng.randint(1000000, 9999999)), "name": f"{city} {kind}", "city": city}]
        for city, kind in ((origin, rng.choice(("Central", "Main"))), (destination, rng.choice(("Central", "Main"))))
    ]
    hours = range(int(time[:2]) + 1, min(int(time[:2]) + 7, 24))  # every train leaves after the time asked
    trains = [
        {
            "train_id": _token(rng, 12),
            "departure": f"{h:02d}:{rng.choice((5, 20, 35, 50)):02d}",
            "price": rng.randint(19, 140),
        }
        for h in rng.sample(hours, min(3, len(hours)))
    ]
    earliest = min(trains, key=lambda t: t["departure"])
    query = rng.choice(
        (
            f"Find me a train from {origin} to {destination} on {said_date} leaving after {said_time}, and show the "
            "seat map of the earliest one.",
            f"I need to get from {origin} to {destination} by train on {said_date}, not before {said_time}. What "
            "seats are free on the first train?",
        )
    )
    search = {
        "from_station_id": stations[0][0]["station_id"],
        "to_station_id": stations[1][0]["station_id"],
        "date": date,
        "departure_after": time,
    }
    calls = [
        ("Search_Station", {"query": origin}),
        ("Search_Station", {"query": destination}),
        ("Search_Trains", search),
        ("Get_Train_Seat_Map", {"train_id": earliest["train_id"]}),
    ]
    seats = {"coaches": [{"coach": c, "free_seats": rng.sample(range(1, 80), 4)} for c in (1, 2)]}
    return query, calls, [*stations, {"trains": trains}, seats]


def _weather(rng: random.Random):
    city, units = rng.choice(CITIES), rng.choice(("metric", "imperial"))
    said_date, date, _ = _date(rng)
    air = rng.random() < 0.5
    place = {"place_id": _token(rng, 8), "name": city, **_coordinates(rng)}
    scale = "Celsius" if units == "metric" else "Fahrenheit"
    query = f"What will the weather be like in {city} on {said_date}, in {scale}?" + (
        " And how is the air quality there?" if air else ""
    )
    where = {"latitude": place["latitude"], "longitude": place["longitude"]}
    calls = [("Geocode_Place", {"name": city}), ("Get_Forecast", {**where, "date": date, "units": units})]
    forecast = {
        "date": date,
        "high": rng.randint(-5, 35),
        "low": rng.randint(-15, 20),
        "sky": rng.choice(("sun", "rain")),
    }
    results = [[place], forecast]
    if air:
        calls.append(("Get_Air_Quality", where))
        results.append({"aqi": rng.randint(10, 160), "dominant": rng.choice(("pm25", "o3", "no2"))})
    return query, calls, results


def _concerts(rng: random.Random):
    performer, city, tickets = rng.choice(PERFORMERS), rng.choice(CITIES), rng.randint(1, 6)
    venue_name = f"{city} {rng.choice(VENUES)}"
    said_start, start, first = _date(rng)
    said_end, end = _later(first, rng.randint(3, 14))
    venue = {"venue_id": f"vn{rng.randint(100000, 999999)}", "name": venue_name, "city": city}
    others = rng.sample([p for p in PERFORMERS if p != performer], 2)
    events = [{"event_id": _token(rng, 9), "title": f"{name} live", "date": end} for name in [performer, *others]]
    rng.shuffle(events)
    wanted = next(e for e in events if e["title"].startswith(performer))
    query = (
        f"I'd like {NUMBER_WORDS[tickets - 1]} tickets for {performer} at the {venue_name} between {said_start} and "
        f"{said_end}."
    )
    calls = [
        ("Search_Venue", {"query": venue_name}),
        ("Search_Events", {"venue_id": venue["venue_id"], "start_date": start, "end_date": end}),
        ("Get_Ticket_Offers", {"event_id": wanted["event_id"], "quantity": tickets}),
    ]
    offers = {"offers": [{"section": s, "price": rng.randint(35, 220)} for s in ("floor", "balcony")]}
    return query, calls, [[venue], {"events": events}, offers]
