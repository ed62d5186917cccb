"""Data loaders: procedure examples (JSONL), catalogs, and the built-in demo procedures."""

from tokmem.data.procedures import Example, Step, load_catalog, load_examples, save_examples

__all__ = ["Example", "Step", "load_catalog", "load_examples", "save_examples"]
