"""The travel agent through the plain ``openai`` client: the tool-calling loop by hand against ``tokmem serve``.

    tokmem serve --banks banks/ &            # a folder holding the trained travel bank
    python examples/travel/openai_loop.py --base-url http://127.0.0.1:8000/v1 --model travel

Each turn the model answers with tool calls (run here by the local fake tools) or with its final answer.
"""

from __future__ import annotations

import json

from openai import OpenAI
from travel_tools import TOOLS, client_arguments, run_tool


def ask(client: OpenAI, model: str, question: str, max_turns: int = 6) -> str:
    """The agent's final answer to ``question`` after the tool calls it makes."""
    messages = [{"role": "user", "content": question}]
    for _ in range(max_turns):
        message = client.chat.completions.create(model=model, messages=messages, tools=TOOLS).choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content or ""
        for call in message.tool_calls:
            print(f"  {call.function.name}({call.function.arguments})")
            result = run_tool(call.function.name, json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return "(no final answer within the turn limit)"


def main(argv: list[str] | None = None) -> None:
    args = client_arguments(__doc__.splitlines()[0], argv)
    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    print(ask(client, args.model, args.question))


if __name__ == "__main__":
    main()
