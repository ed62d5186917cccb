"""tokmem: one-token procedural memory for frozen language models (TokMem)."""

from tokmem.training.adapt import AdaptConfig, adapt
from tokmem.backbones import Backbone, load_backbone
from tokmem.bank.memory_bank import MemoryBank
from tokmem.decoding.chat import ChatCache, chat, chat_batch, run_tools
from tokmem.decoding.tool_rules import Reply, ToolCall
from tokmem.data import Example, Step, load_catalog, load_examples
from tokmem.decoding.decode import DecodeConfig, Generation, Route, generate, route
from tokmem.errors import BackboneError, BankError, DataError, TokMemError
from tokmem.model import TokMemModel, compose, create, load
from tokmem.training.train import TrainConfig, TrainReport, learn, train
from tokmem.version import __version__ as __version__

__all__ = [
    "AdaptConfig",
    "Backbone",
    "BackboneError",
    "BankError",
    "ChatCache",
    "DataError",
    "DecodeConfig",
    "Example",
    "Generation",
    "MemoryBank",
    "Reply",
    "Route",
    "Step",
    "TokMemError",
    "TokMemModel",
    "ToolCall",
    "TrainConfig",
    "TrainReport",
    "adapt",
    "chat",
    "chat_batch",
    "compose",
    "create",
    "generate",
    "learn",
    "load",
    "load_backbone",
    "load_catalog",
    "load_examples",
    "route",
    "run_tools",
    "train",
]
