"""Decoding with a bank: routing, generation and chains (``decode``), the running batch (``batch``), its stopping
rules (``stopping``), schema-bound arguments (``grammar``), and conversations (``chat``: the public API;
``conversation``: the layout of their turns; ``tool_rules``: OpenAI's tool rules, which the server shares)."""
