"""Key-set rows: which of its keys a tool call writes, chosen where the tool is routed.

A call leaves out or adds its tool's optional keys as its query asks, but one memory row writes the keys its
training calls wrote most; the state before the memory token tells them apart (docs/tools.md, "Key-set rows").

So a tool whose training calls write several key sets gets an index row and a bias per key set, its *key-set rows*
(``KeySets``): once the tool's memory token is picked, the state that picked it chooses among them (the largest
``weight @ state + bias``), and the arguments decode under the tool's schema narrowed to that key set (``narrowed``:
each of its keys required, no other; ``tokmem.decoding.grammar``).  Routing is two-stage, the tool's own index row
and then its key-set row, so the tool's rows, name and memory id stay as they are and its key sets share its steer
row.  They are fitted after training (``tokmem.training.refit.fit_key_sets``); a tool whose training calls write one
key set gets none: the schema the bank learned binds it already (``schemas.learned_schema``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class KeySets:
    """A tool's key sets (each its keys in the tool's schema order) and their rows: ``weight`` (key sets, width) and
    ``bias`` (key sets,), float32 on the CPU."""

    keys: list[tuple[str, ...]]
    weight: torch.Tensor
    bias: torch.Tensor

    def scores(self, state: torch.Tensor) -> torch.Tensor:
        """Each key set's score at ``state`` (the hidden state that routed the tool): (key sets,)."""
        return self.weight @ state.detach().float().cpu() + self.bias


def narrowed(schema: dict, keys: tuple[str, ...]) -> dict | None:
    """``schema`` (a tool's arguments) admitting exactly ``keys``, each required; None when it names a key the schema
    has no property for (a client's schema that leaves it out), or the schema is not a plain object of properties."""
    properties = schema.get("properties")
    if "$ref" in schema or not isinstance(properties, dict) or not set(keys) <= set(properties):
        return None
    kept = {name: spec for name, spec in properties.items() if name in keys}
    return {"type": "object", "properties": kept, "required": list(kept)}
