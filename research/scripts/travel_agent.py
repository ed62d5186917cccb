"""What a user sees: the travel agent (``examples/travel/agents_sdk.py``, the OpenAI Agents SDK) asking a served bank a
few questions, each answer's tool calls, their results and whether the final answer quotes a result.

"Quotes a result" is a value of a tool's result (a number, or a string the question does not hold: a flight's number,
a currency) written in the final answer.  Start the server first, e.g.:

    tokmem serve --backbone qwen2.5-coder-0.5b --banks banks/ --port 8011 &
    python -m research.scripts.travel_agent --base-url http://127.0.0.1:8011/v1 --model travel \
        --json results/travel-agent-qwen0.5b.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from agents import Runner, set_tracing_disabled

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "travel"))
from agents_sdk import agent  # noqa: E402 - the example's own agent, as a user runs it

from tokmem.io import write_json_atomic  # noqa: E402
from tokmem.report import machine  # noqa: E402

QUESTIONS = (
    "Tell me the current temperature in Lisbon (celsius).",
    "How much is 250 USD in EUR?",
    "Find me a flight from Oslo to Rome on 2026-08-14.",
)


def result_values(output: str) -> set[str]:
    """The scalar values of one tool result (JSON text), as text."""
    values, stack = set(), [json.loads(output)]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        elif not isinstance(node, bool) and node is not None:
            values.add(str(node))
    return values


def quotes_a_result(question: str, outputs: list[str], answer: str) -> bool:
    """Whether ``answer`` writes a value of a result that the question does not already hold."""
    new = {v for output in outputs for v in result_values(output) if v.lower() not in question.lower()}
    return any(re.search(rf"(?<![\w.]){re.escape(v)}(?![\w])", answer, re.IGNORECASE) for v in new)


def ask(base_url: str, model: str, question: str) -> dict:
    """One question through the SDK's loop: its calls, their results, the answer, and whether it quotes one."""
    start = time.perf_counter()
    result = Runner.run_sync(agent(base_url, model), question, max_turns=6)
    calls = [
        {"name": item.raw_item.name, "arguments": item.raw_item.arguments}
        for item in result.new_items
        if item.type == "tool_call_item"
    ]
    outputs = [item.output for item in result.new_items if item.type == "tool_call_output_item"]
    answer = str(result.final_output)
    return {
        "question": question,
        "calls": calls,
        "results": outputs,
        "answer": answer,
        "quotes_a_result": quotes_a_result(question, outputs, answer),
        "seconds": round(time.perf_counter() - start, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default="travel")
    parser.add_argument("--question", action="append", help=f"repeat (default: the {len(QUESTIONS)} below)")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    set_tracing_disabled(True)
    answers = [ask(args.base_url, args.model, q) for q in args.question or QUESTIONS]
    for a in answers:
        print(
            f"{a['question']}\n  calls {[c['name'] for c in a['calls']]}\n  answer {a['answer']!r}\n"
            f"  quotes a result: {a['quotes_a_result']}"
        )
    write_json_atomic(args.json, {"model": args.model, "machine": machine(), "answers": answers})
    print(f"{sum(a['quotes_a_result'] for a in answers)} of {len(answers)} answers quote a tool's result")


if __name__ == "__main__":
    main()
