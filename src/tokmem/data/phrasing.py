"""Query phrasing: several requests joined into one query, as a user would write it."""

from __future__ import annotations

FIRST_CONNECTOR, MIDDLE_CONNECTOR, LAST_CONNECTOR = "then", "after that", "and also"


def join_queries(parts: list[str]) -> str:
    """Requests for different tools as one: "A, then b, after that c, and also d." (the last part's ? or . ends it)."""
    head, *rest = _clauses(parts)
    linked = [f"{_connector(k, len(rest))} {clause}" for k, clause in enumerate(rest, start=1)]
    return ", ".join([head, *linked]) + _end(parts)


def join_repeats(parts: list[str]) -> str:
    """Requests for one tool as one: "A and b.", "A, b and c." (kept apart from ``join_queries``' connectors)."""
    if len(parts) == 1:
        return parts[0]
    *most, last = _clauses(parts)
    return f"{', '.join(most)} and {last}{_end(parts)}"


def _clauses(parts: list[str]) -> list[str]:
    clauses = [part.strip().rstrip(".!?") for part in parts]
    return clauses[:1] + [_lower_first(clause) for clause in clauses[1:]]


def _connector(k: int, last: int) -> str:
    if k == last and k > 1:
        return LAST_CONNECTOR
    return FIRST_CONNECTOR if k == 1 else MIDDLE_CONNECTOR


def _end(parts: list[str]) -> str:
    return "?" if parts[-1].strip().endswith("?") else "."


def _lower_first(text: str) -> str:
    """Lower-case an ordinary capitalised first word ("Check" → "check"), never "I", "IP" or "McDonald"."""
    word = text.split(" ", 1)[0]
    if len(word) > 1 and word[0].isupper() and word[1:].islower():
        return text[0].lower() + text[1:]
    return text
