"""Prompting baselines for tool calling: ICL (every tool's schema in the prompt) and RAG (the retrieved ones).

Both put tool schemas and two compositional demonstrations into one user turn and let the frozen
backbone answer with the calls, one JSON object a line::

    You can call these tools:
    {"name":"calculate_median","description":"…","parameters":{…}}
    …

    Answer with the tool calls the request needs, one JSON object per line, in the order they are asked for.

    Request: <demonstration query>
    Calls:
    {"name":"…","arguments":{…}}
    {"name":"…","arguments":{…}}

    Request: <query>
    Calls:

The answer ends at its first blank line, the prompt's separator between requests (a stop sequence:
left alone, a small backbone goes on to invent the next request); decoding stops there too.

ICL shows every tool and the first ``shots`` training examples that call two or more different
tools; all its prompts share that prefix, which is encoded once.  When every tool's full schema does not
fit the backbone's context window with room for the answer (ComplexFuncBench's 38 schemas are ~8,000
tokens), ICL shows them compact (``compact_schema``: names, descriptions, parameter names and types) and
says so in its label.  RAG shows the ``k`` tools whose descriptions are most similar to the query and the
``shots`` training examples whose queries are most similar to it (Sentence-BERT cosine).
"""

from __future__ import annotations

import json
from dataclasses import replace

from tokmem.decoding.decode import DecodeConfig
from tokmem.backbones import Backbone
from research.methods.method import Answer, Method, prompted_answers
from research.methods.rag import RAG, embed, load_encoder
from tokmem.data.procedures import Example
from tokmem.model import create

SHOTS = 2  # demonstrations ICL and RAG show
TOOLS_RETRIEVED = 4  # tools RAG shows
INSTRUCTION = "Answer with the tool calls the request needs, one JSON object per line, in the order they are asked for."


def tool_prompt(schemas: list[dict], demonstrations: list[Example], query: str) -> str:
    tools = "\n".join(json.dumps(schema, ensure_ascii=False, separators=(",", ":")) for schema in schemas)
    shots = "".join(f"Request: {d.query}\nCalls:\n{d.response}\n\n" for d in demonstrations)
    return f"You can call these tools:\n{tools}\n\n{INSTRUCTION}\n\n{shots}Request: {query}\nCalls:"


def compact_schema(schema: dict) -> dict:
    """A schema without its parameters' descriptions: ``{"name", "description", "parameters": {name: type}}``,
    the required parameters first, the optional ones marked ``?``."""
    parameters = schema.get("parameters", {})
    properties, required = parameters.get("properties", {}), set(parameters.get("required", []))
    order = sorted(properties, key=lambda name: name not in required)
    types = {(name if name in required else f"{name}?"): properties[name].get("type", "any") for name in order}
    return {"name": schema["name"], "description": schema.get("description", ""), "parameters": types}


def compositional(examples: list[Example]) -> list[Example]:
    """The examples that call two or more different tools."""
    return [e for e in examples if len(set(e.procedures)) > 1]


class ICL(Method):
    name = "icl"
    label = "ICL"

    def __init__(
        self,
        backbone: Backbone,
        tools: dict[str, dict],
        shots: int = SHOTS,
        decode: DecodeConfig | None = None,
    ):
        self.model = create(backbone)  # an empty bank: the plain backbone
        self.schemas = list(tools.values())
        self.decode_config = decode or DecodeConfig()
        if not fits(backbone, tool_prompt(self.schemas, [], ""), self.decode_config.max_new_tokens):
            self.schemas = [compact_schema(schema) for schema in self.schemas]
            self.label = "ICL (compact schemas)"
        self.shots = shots
        self.demonstrations: list[Example] = []

    def learn(self, examples: list[Example]) -> None:
        """Take the demonstrations (the first compositional examples) until there are ``shots`` of them."""
        self.demonstrations = (self.demonstrations + compositional(examples))[: self.shots]

    def prompts(self, queries: list[str]) -> list[str]:
        return [tool_prompt(self.schemas, self.demonstrations, q) for q in queries]

    def answer(self, queries: list[str]) -> list[Answer]:
        prompts = self.prompts(queries)
        texts = prompted_answers(self.model, prompts, replace(self.decode_config, share_prefix=True))
        return [Answer(text) for text in texts]


class ToolRetriever:
    """The study's tool retriever: for each query, the ``k`` tools whose descriptions (``describe``) are most similar
    to it (Sentence-BERT cosine), most similar first."""

    def __init__(self, tools: dict[str, dict], k: int, encoder=None):
        self.encoder = encoder or load_encoder()
        self.schemas, self.k = list(tools.values()), k
        self.vectors = embed(self.encoder, [describe(schema) for schema in self.schemas])

    def __call__(self, queries: list[str]) -> list[list[dict]]:
        scores = embed(self.encoder, queries) @ self.vectors.T
        top = scores.topk(min(self.k, len(self.schemas)), dim=-1).indices.tolist()
        return [[self.schemas[i] for i in row] for row in top]


class ToolRAG(RAG):
    name = "rag"
    label = "RAG"
    choice_metric = None

    def __init__(
        self, backbone: Backbone, tools: dict[str, dict], k: int = TOOLS_RETRIEVED, shots: int = SHOTS, **options
    ):
        super().__init__(backbone, k=shots, **options)
        self.retrieve_tools = ToolRetriever(tools, k, self.encoder)

    def prompts(self, queries: list[str]) -> list[str]:
        return [tool_prompt(t, d, q) for t, d, q in zip(self.retrieve_tools(queries), self.retrieve(queries), queries)]

    def answer(self, queries: list[str]) -> list[Answer]:
        return [Answer(text) for text in prompted_answers(self.model, self.prompts(queries), self.decode_config)]


def fits(backbone: Backbone, prompt: str, max_new_tokens: int, room: float = 0.75) -> bool:
    """Whether ``prompt`` takes at most ``room`` of the context window left after ``max_new_tokens`` (the rest is
    for the demonstrations and the query)."""
    window = getattr(backbone.model.config, "max_position_embeddings", None)
    return window is None or len(backbone.tokenizer(prompt).input_ids) <= room * (window - max_new_tokens)


def describe(schema: dict) -> str:
    """What RAG embeds for a tool: its name in words and its description."""
    return f"{schema['name'].replace('_', ' ')}: {schema.get('description', '')}"
