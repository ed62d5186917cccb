"""The travel agent through the OpenAI Agents SDK against ``tokmem serve`` (Chat Completions model).

    tokmem serve --banks banks/ &            # a folder holding the trained travel bank
    python examples/travel/agents_sdk.py --base-url http://127.0.0.1:8000/v1 --model travel

The three tools are given with their strict schemas (those the bank learned); the SDK runs the loop.
"""

from __future__ import annotations

import json

from agents import Agent, FunctionTool, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
from openai import AsyncOpenAI
from travel_tools import TOOLS, client_arguments, run_tool


def function_tool(tool: dict) -> FunctionTool:
    """An SDK tool from an OpenAI tool schema, run by the local fake tools."""
    name = tool["function"]["name"]

    async def invoke(context, arguments: str) -> str:
        print(f"  {name}({arguments})")
        return run_tool(name, json.loads(arguments or "{}"))

    function = tool["function"]
    return FunctionTool(name, function["description"], function["parameters"], invoke, strict_json_schema=True)


def agent(base_url: str, model: str, api_key: str = "unused", tools: list[dict] = TOOLS, **options) -> Agent:
    """The travel agent on ``tokmem serve``'s bank ``model`` (``options``: more of ``Agent``'s fields)."""
    client = AsyncOpenAI(base_url=base_url, api_key=api_key)
    return Agent(
        name="travel",
        instructions="You help with travel: weather, currency and flights. Use the tools.",
        model=OpenAIChatCompletionsModel(model=model, openai_client=client),
        tools=[function_tool(tool) for tool in tools],
        **options,
    )


def main(argv: list[str] | None = None) -> None:
    args = client_arguments(__doc__.splitlines()[0], argv)
    set_tracing_disabled(True)  # the traces would go to OpenAI's platform
    result = Runner.run_sync(agent(args.base_url, args.model, args.api_key), args.question, max_turns=6)
    print(result.final_output)


if __name__ == "__main__":
    main()
