"""Writes this folder's data: four home/office assistant tools (catalog.json) and queries that call them with the
tools' results (train.jsonl, heldout.jsonl), in tokmem's procedure format.  Seeded: running it again writes the same
files.  A second tool set kept apart from the travel example (``examples/travel/``): no recipe was chosen on it, so its
held-out queries test a trained bank's open-set behaviour on tools nobody tuned on.

    python research/data/assistant/make_data.py

Modelled on ``examples/travel/make_data.py``.  Each example is one call (a sixth are two: a reminder, then an email
carrying it; or music started, then an email naming the track it played), with the result a real tool would return;
about a third close with an answer in words after the result.  The training queries are drawn from templates; the
held-out ones are written by hand apart from them (``HELDOUT_*``: phrasings the bank never saw, a few of them terse).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

HERE = Path(__file__).parent

CATALOG = [
    {
        "name": "set_thermostat",
        "description": "Set the target temperature of a room's thermostat.",
        "parameters": {
            "type": "object",
            "properties": {
                "temperature": {"type": "number"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "room": {"type": "string", "description": "Room name, e.g. living room"},
            },
            "required": ["temperature", "unit", "room"],
        },
    },
    {
        "name": "play_music",
        "description": "Play music matching a search on the home speakers.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "Artist, album, genre or playlist, e.g. Miles Davis"},
                "shuffle": {"type": "boolean", "description": "Play in random order"},
            },
            "required": ["query"],
        },
    },
    {
        "name": "send_email",
        "description": "Send an email to one recipient.",
        "parameters": {
            "type": "object",
            "properties": {
                "to": {"type": "string", "description": "Recipient's email address"},
                "subject": {"type": "string"},
                "body": {"type": "string"},
            },
            "required": ["to", "subject", "body"],
        },
    },
    {
        "name": "add_reminder",
        "description": "Add a reminder at a time on a date.",
        "parameters": {
            "type": "object",
            "properties": {
                "text": {"type": "string", "description": "What to be reminded of"},
                "time": {"type": "string", "description": "HH:MM, 24-hour"},
                "date": {"type": "string", "description": "YYYY-MM-DD"},
            },
            "required": ["text", "time", "date"],
        },
    },
]

ROOMS = ["living room", "bedroom", "kitchen", "office", "bathroom", "nursery", "study", "hallway", "guest room"]
CELSIUS = [17, 18, 19, 20, 20.5, 21, 21.5, 22, 23, 24, 25]
FAHRENHEIT = [62, 64, 65, 66, 68, 70, 71, 72, 74, 75]
# a search (as the query says it) → the track the speakers start with: title, artist, album
LIBRARY = {
    "miles davis": ("So What", "Miles Davis", "Kind of Blue"),
    "fleetwood mac": ("Dreams", "Fleetwood Mac", "Rumours"),
    "nina simone": ("Feeling Good", "Nina Simone", "I Put a Spell on You"),
    "daft punk": ("Get Lucky", "Daft Punk", "Random Access Memories"),
    "radiohead": ("Paranoid Android", "Radiohead", "OK Computer"),
    "adele": ("Rolling in the Deep", "Adele", "21"),
    "bob marley": ("Three Little Birds", "Bob Marley & The Wailers", "Exodus"),
    "stevie wonder": ("Superstition", "Stevie Wonder", "Talking Book"),
    "bach cello suites": ("Cello Suite No. 1 in G major: I. Prelude", "Yo-Yo Ma", "Bach: The Cello Suites"),
    "relaxing jazz": ("Take Five", "The Dave Brubeck Quartet", "Time Out"),
    "80s pop": ("Take On Me", "a-ha", "Hunting High and Low"),
    "piano music for focus": ("Gymnopedie No. 1", "Erik Satie", "Satie: Piano Works"),
}
ARTISTS = ["Miles Davis", "Fleetwood Mac", "Nina Simone", "Daft Punk", "Radiohead", "Adele", "Bob Marley"]
ARTISTS += ["Stevie Wonder", "Bach cello suites", "relaxing jazz", "80s pop", "piano music for focus"]
CONTACTS = [
    "ana.silva@example.com",
    "ben.okafor@example.com",
    "chloe.martin@example.org",
    "dev.patel@example.com",
    "elena.rossi@example.net",
    "farid.haddad@example.com",
    "grace.kim@example.org",
    "hugo.berg@example.com",
    "team@acme.example",
    "landlord@flatmail.example",
]
# (subject, body): plain text, no quotes or newlines (a schema-bound string holds none)
MESSAGES = [
    ("Running late", "I'm running about 15 minutes late, start without me."),
    ("Lunch on Friday", "Are you free for lunch on Friday at 12:30?"),
    ("Quarterly report", "The quarterly report is attached; comments welcome by Monday."),
    ("Thank you", "Thanks for your help with the move last weekend."),
    ("Broken boiler", "The boiler stopped working this morning; can someone take a look?"),
    ("Meeting notes", "Here are the notes from today's meeting: we ship on the 14th."),
    ("Holiday dates", "I'll be away from 2026-08-03 to 2026-08-14."),
    ("Invoice 1042", "Invoice 1042 has been paid in full. Thank you."),
    ("Dinner tonight", "Shall we try the new Thai place at 19:30?"),
    ("Key handover", "I'll leave the spare key with the neighbour at number 12."),
]
TASKS = [
    "call the dentist",
    "pick up the dry cleaning",
    "water the plants",
    "submit the expense report",
    "take out the recycling",
    "renew the car insurance",
    "pay the electricity bill",
    "book a table for Saturday",
    "collect the kids from school",
    "take my vitamins",
    "back up the laptop",
    "send Grandma a birthday card",
]

# A tool's training phrasings: plain, terse, indirect.  A temperature whose query names no unit is in celsius; a
# music query that asks for random order (or for none) sets ``shuffle`` (``shuffle_said``), any other leaves it out.
THERMOSTAT = [
    "Set the {room} to {temp} degrees.",
    "Set the thermostat in the {room} to {temp} {unit}.",
    "thermostat {room} {temp}",
    "Make the {room} {temp}°{letter}.",
    "It's cold in the {room}; heat it to {temp} degrees.",
    "Turn the {room} heating up to {temp}.",
    "Cool the {room} down to {temp} {unit}.",
    "I'd like the {room} at {temp} degrees {unit}.",
    "{room} {temp} {unit}",
    "Can you bring the {room} to {temp}?",
    "Change the {room} temperature to {temp}{letter}.",
    "Warm up the {room} to {temp} degrees before I get home.",
    "Adjust the {room} thermostat: {temp} {unit}.",
    "Target {temp} degrees in the {room}, please.",
    "The {room} feels stuffy - drop it to {temp}.",
    "set temp {room} {temp}",
    "Heat the {room} to {temp}°{letter}, the baby is sleeping there.",
    "Put the {room} thermostat on {temp}.",
    "{temp} degrees {unit} in the {room}",
    "Keep the {room} at {temp} tonight.",
]
MUSIC = [
    "Play {music}.",
    "Put on some {music}.",
    "play {music}",
    "Shuffle {music}.",
    "I want to listen to {music}.",
    "Start {music} on shuffle, please.",
    "music: {music}",
    "Queue up {music}.",
    "Let's hear some {music}.",
    "Play {music} from the top, no shuffle.",
    "I'm in the mood for {music}.",
    "Throw on {music}, mixed up.",
    "{music} please",
    "Put {music} on for me, in order.",
    "Background music: {music}.",
    "Music time - {music}!",
    "Spin some {music}.",
    "shuffle {music_lower}",
    "Can we have {music} on the speakers?",
    "play {music_lower} on random",
]
EMAIL = [
    "Send an email to {to} with the subject '{subject}' saying: {body}",
    "Email {to}, subject '{subject}': {body}",
    "email {to} subject {subject} body {body}",
    "Write to {to}. Subject: {subject}. Message: {body}",
    "Drop {to} a line titled '{subject}' - {body}",
    "Mail {to} ('{subject}'): {body}",
    "Can you email {to}? Subject '{subject}', and the text: {body}",
    "Let {to} know by email, subject '{subject}': {body}",
    "compose to {to} / {subject} / {body}",
    "Fire off an email to {to} called '{subject}' that says {body}",
    "Please send {to} this message under '{subject}': {body}",
    "new email -> {to}, '{subject}', {body}",
    "Shoot {to} a note with subject line '{subject}': {body}",
    "Message {to} by email. '{subject}' is the subject; the body reads: {body}",
    "Email this to {to} - subject '{subject}' - {body}",
    "{to}: email, subject {subject}, text {body}",
    "Send {to} an email about '{subject}'. Write: {body}",
]
REMINDER = [
    "Remind me to {text} at {time} on {date}.",
    "Set a reminder for {date} at {time}: {text}.",
    "reminder {date} {time} {text}",
    "Don't let me forget to {text} - {date}, {time}.",
    "Add a reminder: {text}, {time} on {date}.",
    "Can you remind me on {date} at {time} to {text}?",
    "I need to {text} on {date} at {time}; remind me.",
    "Ping me at {time} on {date} to {text}.",
    "remind {time} {date} {text}",
    "Put '{text}' in my reminders for {date}, {time}.",
    "Nudge me on {date} around {time}: {text}.",
    "{date} {time} reminder: {text}",
    "Make sure I {text} - alert me at {time} on {date}.",
    "Could you set up a reminder to {text}? {date} at {time} works.",
    "Schedule a reminder ({date}, {time}) to {text}.",
    "to-do {date} {time}: {text}",
    "I keep forgetting to {text}. Remind me {date} at {time}.",
]
REMINDER_EMAIL = [
    "Remind me to {text} at {time} on {date}, and email {to} about it.",
    "Set a reminder to {text} ({date}, {time}) and let {to} know by email.",
    "reminder {date} {time} {text}, then email {to}",
    "Add '{text}' to my reminders for {date} at {time} and send {to} the details.",
    "Schedule a reminder to {text} for {time} on {date}; email {to} the reminder.",
    "Ping me on {date} at {time} to {text} and copy {to} by email.",
    "Remind me ({date} {time}): {text}. Email {to} too.",
]
MUSIC_EMAIL = [
    "Play {music} and email {to} the song that comes on.",
    "Put on {music}, then tell {to} by email what's playing.",
    "play {music}, email {to} the track",
    "Start some {music} and send {to} the name of the first song.",
    "Queue {music} and email {to} what I'm listening to.",
    "Let's hear {music} - and mail {to} the track title.",
]

# The held-out queries, written by hand apart from the templates above, as a user would ask them: a fair test of
# phrasings the bank never trained on (none of them is formed by a template).  Each with the values its call should
# carry.
HELDOUT_THERMOSTAT = [
    ("Could you make it a bit warmer in the bedroom, say 22 degrees?", 22, "celsius", "bedroom"),
    ("kitchen 68F", 68, "fahrenheit", "kitchen"),
    ("I'm freezing in the study. 23 please.", 23, "celsius", "study"),
    ("Please lower the nursery temperature to 19.", 19, "celsius", "nursery"),
    ("office to 72 fahrenheit", 72, "fahrenheit", "office"),
    ("What I want is 20.5 degrees in the living room.", 20.5, "celsius", "living room"),
    ("bathroom heat 24", 24, "celsius", "bathroom"),
    ("Before the guests arrive, get the guest room to 21 celsius.", 21, "celsius", "guest room"),
    ("It's boiling in the hallway - 18 would be nicer.", 18, "celsius", "hallway"),
]
HELDOUT_MUSIC = [
    ("I'd love to hear Nina Simone right now", "Nina Simone", None),
    ("daft punk, random order", "daft punk", True),
    ("Put Radiohead on, please", "Radiohead", None),
    ("Some Stevie Wonder would be great.", "Stevie Wonder", None),
    ("Play Bach cello suites in sequence, don't mix them up.", "Bach cello suites", False),
    ("relaxing jazz pls", "relaxing jazz", None),
    ("Could I get some 80s pop going?", "80s pop", None),
    ("Adele, shuffled", "Adele", True),
    ("Time for Bob Marley!", "Bob Marley", None),
]
HELDOUT_EMAIL = [
    (
        "Please email dev.patel@example.com about 'Lunch on Friday' and ask: Are you free for lunch on Friday at 12:30?",
        "dev.patel@example.com",
        "Lunch on Friday",
        "Are you free for lunch on Friday at 12:30?",
    ),
    (
        "mail hugo.berg@example.com re Key handover: I'll leave the spare key with the neighbour at number 12.",
        "hugo.berg@example.com",
        "Key handover",
        "I'll leave the spare key with the neighbour at number 12.",
    ),
    (
        "I need team@acme.example to get the report - subject Quarterly report, text: The quarterly report is "
        "attached; comments welcome by Monday.",
        "team@acme.example",
        "Quarterly report",
        "The quarterly report is attached; comments welcome by Monday.",
    ),
    (
        "New message for elena.rossi@example.net. Title it 'Thank you' and write: Thanks for your help with the move "
        "last weekend.",
        "elena.rossi@example.net",
        "Thank you",
        "Thanks for your help with the move last weekend.",
    ),
    (
        "Could you write landlord@flatmail.example an email headed 'Broken boiler'? Body: The boiler stopped working "
        "this morning; can someone take a look?",
        "landlord@flatmail.example",
        "Broken boiler",
        "The boiler stopped working this morning; can someone take a look?",
    ),
    (
        "chloe.martin@example.org | Dinner tonight | Shall we try the new Thai place at 19:30?",
        "chloe.martin@example.org",
        "Dinner tonight",
        "Shall we try the new Thai place at 19:30?",
    ),
    (
        "Let ben.okafor@example.com have my holiday dates, headline Holiday dates, content I'll be away from "
        "2026-08-03 to 2026-08-14.",
        "ben.okafor@example.com",
        "Holiday dates",
        "I'll be away from 2026-08-03 to 2026-08-14.",
    ),
    (
        "grace.kim@example.org needs to hear I'm late. Subject Running late, and the words: I'm running about 15 "
        "minutes late, start without me.",
        "grace.kim@example.org",
        "Running late",
        "I'm running about 15 minutes late, start without me.",
    ),
    (
        "Confirm payment to farid.haddad@example.com by email (Invoice 1042): Invoice 1042 has been paid in full. "
        "Thank you.",
        "farid.haddad@example.com",
        "Invoice 1042",
        "Invoice 1042 has been paid in full. Thank you.",
    ),
]
HELDOUT_REMINDER = [
    (
        "At 08:30 on 2026-07-02 I have to call the dentist, don't let it slip.",
        "call the dentist",
        "08:30",
        "2026-07-02",
    ),
    ("water the plants 2026-06-18 19:00", "water the plants", "19:00", "2026-06-18"),
    (
        "Please note that I must pay the electricity bill on 2026-08-05 at 10:00.",
        "pay the electricity bill",
        "10:00",
        "2026-08-05",
    ),
    ("Alert 17:45, 2026-09-12: pick up the dry cleaning", "pick up the dry cleaning", "17:45", "2026-09-12"),
    (
        "Help me remember to renew the car insurance; 2026-07-20, 09:15.",
        "renew the car insurance",
        "09:15",
        "2026-07-20",
    ),
    ("I'll want a heads-up to take my vitamins, 07:30 on 2026-06-25.", "take my vitamins", "07:30", "2026-06-25"),
    ("back up the laptop @ 21:00 2026-08-30", "back up the laptop", "21:00", "2026-08-30"),
    (
        "I should submit the expense report at 16:00 on 2026-09-01. Can you make sure I do?",
        "submit the expense report",
        "16:00",
        "2026-09-01",
    ),
    (
        "New reminder, collect the kids from school, for 15:15 on 2026-06-09.",
        "collect the kids from school",
        "15:15",
        "2026-06-09",
    ),
]
HELDOUT_REMINDER_EMAIL = [
    (
        "Set me an 18:00 reminder on 2026-07-10 to book a table for Saturday, and send the details to "
        "chloe.martin@example.org.",
        "book a table for Saturday",
        "18:00",
        "2026-07-10",
        "chloe.martin@example.org",
    ),
    (
        "On 2026-08-21 at 11:30 I need to take out the recycling - remind me, and email hugo.berg@example.com so he "
        "knows.",
        "take out the recycling",
        "11:30",
        "2026-08-21",
        "hugo.berg@example.com",
    ),
]
HELDOUT_MUSIC_EMAIL = [
    ("Play me some Adele, and let dev.patel@example.com know the track by mail.", "Adele", "dev.patel@example.com"),
    (
        "Fleetwood Mac please - then email grace.kim@example.org the song title.",
        "Fleetwood Mac",
        "grace.kim@example.org",
    ),
]


def call(name: str, arguments: dict) -> str:
    return json.dumps({"name": name, "arguments": arguments}, separators=(",", ":"))


def thermostat(rng: random.Random) -> dict:
    template, room = rng.choice(THERMOSTAT), rng.choice(ROOMS)
    said = "{unit}" in template or "{letter}" in template
    unit = rng.choice(["celsius", "fahrenheit"]) if said else "celsius"  # unsaid: celsius
    temp = rng.choice(CELSIUS if unit == "celsius" else FAHRENHEIT)
    query = template.format(room=room, temp=f"{temp:g}", unit=unit, letter=unit[0].upper())
    return thermostat_example(rng, query, temp, unit, room)


def thermostat_example(rng: random.Random, query: str, temp: float, unit: str, room: str) -> dict:
    current = rng.randint(15, 27) if unit == "celsius" else rng.randint(59, 81)
    mode = "heating" if current < temp else "cooling" if current > temp else "idle"
    result = {"room": room, "target": temp, "unit": unit, "current_temperature": current, "mode": mode}
    return {
        "query": query,
        "steps": [
            {
                "procedure": "set_thermostat",
                "response": call("set_thermostat", {"temperature": temp, "unit": unit, "room": room}),
                "result": json.dumps(result),
            }
        ],
        "answer": f"The {room} is set to {temp:g}° {unit}; it is {current}° now, so the system is {mode}.",
    }


def shuffle_said(template: str) -> bool | None:
    """Whether a music query asks for random order (True), for the album's own order (False), or says nothing."""
    if "no shuffle" in template or "in order" in template:
        return False
    if any(word in template for word in ("huffle", "mixed up", "random")):
        return True
    return None


def music(rng: random.Random) -> dict:
    template, artist = rng.choice(MUSIC), rng.choice(ARTISTS)
    search = artist.lower() if "{music_lower}" in template else artist
    query = template.format(music=artist, music_lower=artist.lower())
    return music_example(rng, query, search, shuffle_said(template))


def now_playing(rng: random.Random, search: str, shuffle: bool | None) -> dict:
    title, artist, album = LIBRARY[search.lower()]
    return {
        "status": "playing",
        "now_playing": {"title": title, "artist": artist, "album": album},
        "queue_length": rng.randint(12, 80),
        "shuffle": bool(shuffle),
    }


def music_example(rng: random.Random, query: str, search: str, shuffle: bool | None) -> dict:
    result = now_playing(rng, search, shuffle)
    arguments = {"query": search} | ({} if shuffle is None else {"shuffle": shuffle})
    track = result["now_playing"]
    order = " on shuffle" if shuffle else ""
    return {
        "query": query,
        "steps": [{"procedure": "play_music", "response": call("play_music", arguments), "result": json.dumps(result)}],
        "answer": f"Now playing {track['title']} by {track['artist']}{order}, {result['queue_length']} tracks queued.",
    }


def sent(rng: random.Random, to: str) -> dict:
    return {"status": "sent", "to": to, "message_id": f"msg-{rng.randrange(16**8):08x}"}


def email_step(rng: random.Random, to: str, subject: str, body: str) -> dict:
    arguments = {"to": to, "subject": subject, "body": body}
    return {"procedure": "send_email", "response": call("send_email", arguments), "result": json.dumps(sent(rng, to))}


def email(rng: random.Random) -> dict:
    to, (subject, body) = rng.choice(CONTACTS), rng.choice(MESSAGES)
    query = rng.choice(EMAIL).format(to=to, subject=subject, body=body)
    return email_example(rng, query, to, subject, body)


def email_example(rng: random.Random, query: str, to: str, subject: str, body: str) -> dict:
    return {
        "query": query,
        "steps": [email_step(rng, to, subject, body)],
        "answer": f"Sent your email '{subject}' to {to}.",
    }


def when(rng: random.Random) -> tuple[str, str]:
    time = f"{rng.randint(7, 21):02d}:{rng.choice(['00', '15', '30', '45'])}"
    return time, f"2026-{rng.choice([6, 7, 8, 9]):02d}-{rng.randint(1, 28):02d}"


def reminder_step(rng: random.Random, text: str, time: str, date: str) -> tuple[dict, dict]:
    result = {"id": f"rem-{rng.randint(1000, 9999)}", "text": text, "due": f"{date}T{time}", "status": "scheduled"}
    arguments = {"text": text, "time": time, "date": date}
    return result, {
        "procedure": "add_reminder",
        "response": call("add_reminder", arguments),
        "result": json.dumps(result),
    }


def reminder(rng: random.Random) -> dict:
    text, (time, date) = rng.choice(TASKS), when(rng)
    query = rng.choice(REMINDER).format(text=text, time=time, date=date)
    return reminder_example(rng, query, text, time, date)


def reminder_example(rng: random.Random, query: str, text: str, time: str, date: str) -> dict:
    _, step = reminder_step(rng, text, time, date)
    return {"query": query, "steps": [step], "answer": f"Reminder set for {date} at {time}: {text}."}


def reminder_email(rng: random.Random) -> dict:
    """Two calls: the reminder, then an email carrying it (its id and due time come from the first result)."""
    text, (time, date), to = rng.choice(TASKS), when(rng), rng.choice(CONTACTS)
    query = rng.choice(REMINDER_EMAIL).format(text=text, time=time, date=date, to=to)
    return reminder_email_example(rng, query, text, time, date, to)


def reminder_email_example(rng: random.Random, query: str, text: str, time: str, date: str, to: str) -> dict:
    result, step = reminder_step(rng, text, time, date)
    due_date, due_time = result["due"].split("T")
    body = f"I set a reminder ({result['id']}) for {due_date} at {due_time}: {result['text']}."
    return {
        "query": query,
        "steps": [step, email_step(rng, to, f"Reminder: {text}", body)],
        "answer": f"Reminder set for {date} at {time}, and {to} has the details by email.",
    }


def music_email(rng: random.Random) -> dict:
    """Two calls: the music, then an email naming the track it started with (from the first result)."""
    artist, to = rng.choice(ARTISTS), rng.choice(CONTACTS)
    query = rng.choice(MUSIC_EMAIL).format(music=artist, to=to)
    return music_email_example(rng, query, artist, to)


def music_email_example(rng: random.Random, query: str, search: str, to: str) -> dict:
    result = now_playing(rng, search, None)
    track = result["now_playing"]
    return {
        "query": query,
        "steps": [
            {
                "procedure": "play_music",
                "response": call("play_music", {"query": search}),
                "result": json.dumps(result),
            },
            email_step(rng, to, "Now playing", f"I'm listening to {track['title']} by {track['artist']}."),
        ],
        "answer": f"Now playing {track['title']} by {track['artist']}; I emailed {to} the track.",
    }


def examples(rng: random.Random, count: int, prefix: str) -> list[dict]:
    """``count`` examples, each tool first in a quarter of them (every third reminder and music query sends an email
    after it, so that a sixth of the examples are two calls, as in the travel data, and neither first tool's row
    trains mostly on two-call examples); a third keep their answer."""
    makers = [thermostat, music, email, reminder, thermostat, reminder_email]
    makers += [email, music, thermostat, music_email, email, reminder]
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
        for rows in zip(HELDOUT_THERMOSTAT, HELDOUT_MUSIC, HELDOUT_EMAIL, HELDOUT_REMINDER)
        for example in (
            thermostat_example(rng, *rows[0]),
            music_example(rng, *rows[1]),
            email_example(rng, *rows[2]),
            reminder_example(rng, *rows[3]),
        )
    ]
    made += [reminder_email_example(rng, *row) for row in HELDOUT_REMINDER_EMAIL]
    made += [music_email_example(rng, *row) for row in HELDOUT_MUSIC_EMAIL]
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
