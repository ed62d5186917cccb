"""Scoring: metrics of answers and tool calls, and the evaluation of a bank on a data file."""
