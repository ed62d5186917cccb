"""The memory bank: its rows and their edits (``memory_bank``), its two files (``file_format``), the ids its rows,
tails and shared rows take above the vocabulary (``memory_ids``) and a tool's key-set rows (``key_sets``)."""

from tokmem.bank.memory_bank import MemoryBank

__all__ = ["MemoryBank"]
