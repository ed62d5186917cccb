"""The built-in tool catalog: 50 tools in the style of APIGen / xLAM, read from ``tool_catalog.json``.

Each tool is one procedure, with a JSON-schema signature, an argument sampler and query templates; its calls are
never executed, the call itself is the answer.  25 tools are for the adaptation phase and 25 for evaluation (after
the paper's evaluation tools), disjoint.  A call is rendered as compact JSON ``{"name": …, "arguments": {…}}``
(arguments in the order of the tool's signature).  To go beyond 25 + 25 tools, pass your own ``Tool`` objects
wherever tool names are accepted.

``tool_catalog.json`` lists the tools in order, each as an object with ``group`` (``"adaptation"`` or
``"evaluation"``), ``name``, ``description``, ``params`` (``name``, ``type``: the JSON schema of a value,
``description``, ``required``), ``sample`` (the argument sampler, described in ``tokmem.data.tool_samplers``) and
``templates`` (see ``Tool``; a template with fixed arguments is a ``[text, {fixed}]`` pair).
"""

from __future__ import annotations

import json
import random
import string
from dataclasses import dataclass
from importlib import resources
from typing import Callable

from tokmem.data.procedures import Step, call_json
from tokmem.data.tool_samplers import sampler
from tokmem.errors import DataError

ADAPTATION, EVALUATION = "adaptation", "evaluation"


def array_of(item: dict) -> dict:
    return {"type": "array", "items": item}


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


def _load() -> tuple[Tool, ...]:
    entries = json.loads(resources.files(__package__).joinpath("tool_catalog.json").read_text(encoding="utf-8"))
    return tuple(
        Tool(
            name=entry["name"],
            description=entry["description"],
            params=tuple(Param(p["name"], p["type"], p["description"], p["required"]) for p in entry["params"]),
            sample=sampler(entry["sample"]),
            templates=tuple(t if isinstance(t, str) else tuple(t) for t in entry["templates"]),
            group=entry["group"],
        )
        for entry in entries
    )


_ALL = _load()
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
