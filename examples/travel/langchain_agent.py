"""The travel agent through LangChain (``langchain-openai``'s ``ChatOpenAI``) against ``tokmem serve``.

    tokmem serve --banks banks/ &            # a folder holding the trained travel bank
    python examples/travel/langchain_agent.py --base-url http://127.0.0.1:8000/v1 --model travel

The model is bound to the three tools (``bind_tools``); the loop runs each call and sends back a ``ToolMessage``.
"""

from __future__ import annotations


from langchain_core.messages import HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI
from travel_tools import TOOLS, client_arguments, run_tool


def ask(llm: ChatOpenAI, question: str, max_turns: int = 6) -> str:
    """The agent's final answer to ``question`` after the tool calls it makes."""
    model = llm.bind_tools(TOOLS)
    messages = [HumanMessage(question)]
    for _ in range(max_turns):
        reply = model.invoke(messages)
        messages.append(reply)
        if not reply.tool_calls:
            return reply.text
        for call in reply.tool_calls:
            print(f"  {call['name']}({call['args']})")
            messages.append(ToolMessage(run_tool(call["name"], call["args"]), tool_call_id=call["id"]))
    return "(no final answer within the turn limit)"


def main(argv: list[str] | None = None) -> None:
    args = client_arguments(__doc__.splitlines()[0], argv)
    llm = ChatOpenAI(model=args.model, base_url=args.base_url, api_key=args.api_key)
    print(ask(llm, args.question))


if __name__ == "__main__":
    main()
