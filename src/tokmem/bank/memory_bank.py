"""MemoryBank: the named memory rows, their trainable/frozen split, renormalisation, and the bank file.

A coupled bank has one matrix used both as input embeddings (steering) and as LM-head rows (indexing).
A decoupled (DC) bank keeps a separate ``steer`` matrix for the input side; ``index`` is always the
LM-head side.  Rows are float32 on the CPU; the model moves them where they are needed.

Each row has a kind: ``text`` (its memory token is followed by the response text) or ``tool`` (it is
followed by the tool's arguments as JSON only: the memory token is the tool choice, and answers
assemble the whole call ``{"name": procedure, "arguments": …}``).  A tool row may keep its tool's JSON schema
(``schemas``: OpenAI's function ``parameters``), which binds the arguments decoded after its memory token.  A bank
that *shows schemas* (``shows_schemas``, the ``tokmem+schema`` method) was trained with each tool's schema in context
between its memory token and its arguments (``tokmem.training.sequences.CallContext``), and is decoded so
(``tokmem.chat``).

A bank of several *memory tokens* a procedure (``memory_tokens`` k > 1, tools only) gives each tool k - 1 more input
rows, its ``tail``: always laid out right after its memory token, never predicted (no LM-head side), they are more
room to steer the tool's arguments than one row, for k - 1 more rows of parameters.  The memory token still routes
alone.  A bank may also have *shared rows* (``shared_tokens``, tools only): input rows every tool reads after its own
memory tokens, trained on every tool's calls, so that what the tools' arguments have in common (which optional keys
are written, how values are copied) is learnt from all of them rather than from each tool's few calls.  They train
only in the bank's first round (``shared_trainable``): a tool added later reads them as they are, so adding tools
never changes how the old ones are steered.

A tool row may have *key-set rows* (``key_sets``: ``tokmem.bank.key_sets.KeySets``, fitted after training): its training
calls' key sets, one chosen by the state that routed the tool, its arguments then bound to exactly those keys.

On disk a bank is ``<path>`` (safetensors) plus ``<path>.json`` (metadata), as ``tokmem.bank.file_format`` lays them
out and checks them when read; the two files are written together (``tokmem.io.write_files``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tokmem.bank.file_format import (
    FORMAT,
    FORMAT_VERSION,
    KEY_SETS_VERSION,
    KINDS,
    MAX_MEMORY_TOKENS,
    MAX_SHARED_TOKENS,
    MEMORY_TOKENS,
    SHARED_TOKENS,
    SHARED_VERSION,
    TAILS_VERSION,
    existing_metadata,
    metadata_path,
    name_problem,
    read_metadata,
    read_tensors,
    save_tensors,
    schemas_problem,
)
from tokmem.errors import BankError, clipped, listed
from tokmem.io import write_files
from tokmem.bank.key_sets import KeySets

ROW_NORM_FACTOR = 1000.0  # rows may be at most this many times the backbone's mean embedding norm


class MemoryBank:
    def __init__(
        self,
        hidden_size: int,
        decoupled: bool = False,
        backbone: dict | None = None,
        shows_schemas: bool = False,
        memory_tokens: int = MEMORY_TOKENS,
        shared_tokens: int = SHARED_TOKENS,
    ):
        if not 1 <= memory_tokens <= MAX_MEMORY_TOKENS:
            raise BankError(f"memory_tokens must be from 1 to {MAX_MEMORY_TOKENS}, not {memory_tokens}")
        if not 0 <= shared_tokens <= MAX_SHARED_TOKENS:
            raise BankError(f"shared_tokens must be from 0 to {MAX_SHARED_TOKENS}, not {shared_tokens}")
        self.hidden_size, self.shows_schemas = hidden_size, shows_schemas
        self.names: list[str] = []  # edited only here, with _index_names() after each change
        self._rows: dict[str, int] = {}
        self.descriptions: list[str] = []
        self.kinds: list[str] = []
        self.schemas: list[dict | None] = []  # per row: its tool's JSON schema, or None
        self.key_sets: list[KeySets | None] = []  # per row: its tool's key-set rows, or None (tokmem.bank.key_sets)
        self.threshold: float | None = None  # the open-set threshold it decodes with unless told (None: the rule's)
        self.index = torch.empty(0, hidden_size)
        self.steer = torch.empty(0, hidden_size) if decoupled else None
        self.tail = torch.empty(0, memory_tokens - 1, hidden_size)  # per procedure, its input rows after the first
        self.shared = torch.zeros(shared_tokens, hidden_size)  # input rows every tool reads after its own
        self.trainable = torch.empty(0, dtype=torch.bool)
        self.backbone = backbone or {}

    # ---- shape and lookup ---------------------------------------------------------------
    @property
    def decoupled(self) -> bool:
        return self.steer is not None

    @property
    def memory_tokens(self) -> int:
        """How many memory tokens a procedure has: the one that routes, then its tail."""
        return 1 + self.tail.shape[1]

    @property
    def shared_tokens(self) -> int:
        """How many input rows every tool shares, read after its own memory tokens."""
        return self.shared.shape[0]

    @property
    def shared_trainable(self) -> bool:
        """Whether the shared rows train now: in the bank's first round only (every row trainable)."""
        return self.shared_tokens > 0 and len(self) > 0 and bool(self.trainable.all())

    @property
    def steer_matrix(self) -> torch.Tensor:
        """The input-side rows: ``steer`` for DC, else the shared matrix."""
        return self.steer if self.decoupled else self.index

    def __len__(self) -> int:
        return len(self.names)

    def __contains__(self, name: str) -> bool:
        return name in self._rows

    def row(self, name: str) -> int:
        try:
            return self._rows[name]
        except KeyError:
            raise BankError(
                f"no procedure {clipped(repr(name))} in the bank (it has: {listed(self.names) or 'none'})"
            ) from None

    def _index_names(self) -> None:
        """Rebuild the name -> row table after ``names`` changed."""
        self._rows = {name: row for row, name in enumerate(self.names)}

    def is_tool(self, row: int) -> bool:
        """Whether the row's memory token is followed by a tool's arguments (answers assemble the call)."""
        return self.kinds[row] == "tool"

    def tool_schemas(self) -> dict[str, dict | None]:
        """Each tool row's name → its JSON schema (None where the bank has none)."""
        return {name: schema for name, kind, schema in zip(self.names, self.kinds, self.schemas) if kind == "tool"}

    def tool_names(self) -> set[str]:
        return {name for name, kind in zip(self.names, self.kinds) if kind == "tool"}

    def trainable_rows(self) -> torch.Tensor:
        return self.trainable.nonzero().flatten()

    def parameter_count(self, trainable_only: bool = False) -> int:
        rows = int(self.trainable.sum()) if trainable_only else len(self)
        shared = self.shared_tokens if self.shared_trainable or not trainable_only else 0
        key_sets = sum(
            len(k.keys) for k, t in zip(self.key_sets, self.trainable.tolist()) if k and (t or not trainable_only)
        )
        return (rows * (self.memory_tokens + int(self.decoupled)) + shared) * self.hidden_size + key_sets * (
            self.hidden_size + 1
        )

    # ---- editing --------------------------------------------------------------------------
    def add(self, names, init: torch.Tensor, descriptions=None, kinds=None, schemas=None) -> list[int]:
        """Append new trainable rows, initialised to ``init``: one vector for every row (e.g. the backbone's
        mean embedding) or a matrix of one row each.  ``kinds``: each row's kind (default ``text``); ``schemas``:
        each row's tool schema or None (default None)."""
        names = list(names)
        schemas = list(schemas) if schemas is not None else [None] * len(names)
        problem = schemas_problem(schemas, len(names))
        if problem:
            raise BankError(f"schemas{problem}")
        descriptions = list(descriptions) if descriptions is not None else [""] * len(names)
        kinds = list(kinds) if kinds is not None else ["text"] * len(names)
        for kind in kinds:
            _check_kind(kind)
        if self.context_rows() and "text" in kinds:
            raise BankError(
                f"a bank with {self.context_rows()} holds tools only; '{names[kinds.index('text')]}' is a text procedure"
            )
        for name in names:
            _check_name(name)
            if name in self._rows or names.count(name) > 1:
                raise BankError(f"procedure '{name}' is already in the bank")
        if init.shape not in ((self.hidden_size,), (len(names), self.hidden_size)):
            raise BankError(
                f"init has shape {tuple(init.shape)}, expected ({self.hidden_size},) or ({len(names)}, {self.hidden_size})"
            )
        rows = init.detach().float().cpu().expand(len(names), -1).clone()
        start = len(self)
        if start == 0:  # a new bank: its shared rows start where its first rows do, on average
            self.shared = rows.mean(0).expand(self.shared_tokens, -1).clone()
        self.names += names
        self.descriptions += descriptions
        self.kinds += kinds
        self.schemas += schemas
        self.key_sets += [None] * len(names)
        self._index_names()
        self.index = torch.cat([self.index, rows])
        if self.decoupled:
            self.steer = torch.cat([self.steer, rows.clone()])
        self.tail = torch.cat([self.tail, rows.unsqueeze(1).expand(-1, self.tail.shape[1], -1).clone()])
        self.trainable = torch.cat([self.trainable, torch.ones(len(names), dtype=torch.bool)])
        return list(range(start, len(self)))

    def context_rows(self) -> str:
        """The rows each tool's memory token is followed by, in words ('' for none): banks with them hold tools only."""
        parts = [f"{self.memory_tokens} memory tokens a tool"] if self.memory_tokens > 1 else []
        parts += [f"{self.shared_tokens} shared row{'s' * (self.shared_tokens > 1)}"] if self.shared_tokens else []
        return " and ".join(parts)

    def freeze(self) -> None:
        self.trainable[:] = False

    def decouple(self) -> None:
        """Give a coupled bank an input side of its own, a copy of its one matrix, so that its index side can change
        without changing what its memory tokens steer (``tokmem.training.refit``); a decoupled bank stays as it is."""
        if not self.decoupled:
            self.steer = self.index.clone()

    def remove(self, name: str) -> None:
        keep = torch.tensor([n != name for n in self.names])
        row = self.row(name)
        del self.names[row], self.descriptions[row], self.kinds[row], self.schemas[row], self.key_sets[row]
        self._index_names()
        self.index = self.index[keep]
        if self.decoupled:
            self.steer = self.steer[keep]
        self.tail = self.tail[keep]
        self.trainable = self.trainable[keep]

    def rename(self, old: str, new: str) -> None:
        _check_name(new)
        if new in self._rows:
            raise BankError(f"cannot rename '{old}' to '{new}': '{new}' is already in the bank")
        self.names[self.row(old)] = new
        self._index_names()

    def merge(self, other: "MemoryBank") -> None:
        """Append every row of ``other`` (same backbone and form); names must not clash."""
        if other.decoupled != self.decoupled or other.hidden_size != self.hidden_size:
            raise BankError("cannot merge a coupled bank with a decoupled one, or banks of different widths")
        if other.shows_schemas != self.shows_schemas:
            raise BankError("cannot merge a bank that shows its tools' schemas with one that does not")
        if other.memory_tokens != self.memory_tokens:
            raise BankError(
                f"cannot merge a bank of {other.memory_tokens} memory tokens a procedure into one of {self.memory_tokens}"
            )
        if self.shared_tokens or other.shared_tokens:
            raise BankError(
                "cannot merge banks with shared rows: each bank's shared rows were trained for its own tools "
                "(add the tools to one bank with tokmem train instead)"
            )
        if other.backbone.get("fingerprint") != self.backbone.get("fingerprint"):
            raise BankError(
                f"cannot merge banks trained for different backbones "
                f"({self.backbone.get('name')} vs {other.backbone.get('name')})"
            )
        clash = sorted(set(self.names) & set(other.names))
        if clash:
            raise BankError(f"cannot merge: both banks have {', '.join(clash)} (rename one first)")
        self.names += other.names
        self.descriptions += other.descriptions
        self.kinds += other.kinds
        self.schemas += other.schemas
        self.key_sets += other.key_sets
        given = [t for t in (self.threshold, other.threshold) if t is not None]
        self.threshold = max(given) if given else None  # the stricter open-set rule of the two
        self._index_names()
        self.index = torch.cat([self.index, other.index])
        if self.decoupled:
            self.steer = torch.cat([self.steer, other.steer])
        self.tail = torch.cat([self.tail, other.tail])
        self.trainable = torch.cat([self.trainable, other.trainable])

    def refuse_shown_schemas(self, decoder: str) -> None:
        """A ``BankError`` if the bank shows its tools' schemas between their memory tokens and their arguments:
        ``decoder`` cannot lay a schema out after routing (``tokmem.chat`` and ``tokmem serve`` can)."""
        if self.shows_schemas:
            raise BankError(
                f"this bank shows its tools' schemas before their arguments (tokmem+schema): {decoder} does not "
                "decode such a bank yet (tokmem.chat and tokmem serve do)"
            )

    # ---- renormalisation ----------------------------------------------------------------
    def norms(self, side: str = "index") -> torch.Tensor:
        """Each row's L2 norm on one ``side``: index (the LM-head rows routing scores) or steer (the input rows)."""
        return self.side(side).norm(dim=1)

    def side(self, side: str) -> torch.Tensor:
        """The ``index`` or ``steer`` matrix (a coupled bank's one matrix is both)."""
        return self.steer_matrix if side == "steer" else self.index

    def renormalize(
        self, new_rows, eps: float = 1e-8, target: float | None = None, side: str = "index"
    ) -> float | None:
        """Rescale ``new_rows`` of one ``side``'s matrix to the mean L2 norm of every other row (or to ``target``).

        m_i <- m_i * n_I / (||m_i|| + eps), n_I the mean norm of the existing rows (the paper's Eq. 4).  The paper's
        DC banks renormalise the index matrix (``side="index"``); ``"steer"`` renormalises the input side instead.
        Returns n_I, or None when there are no existing rows and no ``target``.
        """
        new_rows = torch.as_tensor(new_rows, dtype=torch.long)
        existing = torch.ones(len(self), dtype=torch.bool)
        existing[new_rows] = False
        if len(new_rows) == 0 or (target is None and not existing.any()):
            return None
        matrix = self.side(side)
        target = matrix[existing].norm(dim=1).mean() if target is None else torch.tensor(target)
        rows = matrix[new_rows]
        matrix[new_rows] = rows * (target / (rows.norm(dim=1, keepdim=True) + eps))
        return float(target)

    # ---- files ------------------------------------------------------------------------------
    def metadata(self) -> dict:
        norms = self.norms()
        return {
            "format": FORMAT,
            "format_version": self._format_version(),
            "hidden_size": self.hidden_size,
            "num_rows": len(self),
            "decoupled": self.decoupled,
            "shows_schemas": self.shows_schemas,
            "memory_tokens": self.memory_tokens,
            "shared_tokens": self.shared_tokens,
            "dtype": "float32",
            "names": self.names,
            "descriptions": self.descriptions,
            "kinds": self.kinds,
            "schemas": self.schemas,
            **(
                {"key_sets": [k and [list(keys) for keys in k.keys] for k in self.key_sets]}
                if self.has_key_sets
                else {}
            ),
            **({"threshold": self.threshold} if self.threshold is not None else {}),
            "backbone": self.backbone,
            "norms": {
                "mean": float(norms.mean()) if len(self) else None,
                "min": float(norms.min()) if len(self) else None,
                "max": float(norms.max()) if len(self) else None,
                "per_row": [round(float(n), 6) for n in norms],
            },
        }

    def _format_version(self) -> int:
        """The oldest format that holds this bank: a reader that cannot lay out its rows refuses it."""
        if self.has_key_sets:
            return KEY_SETS_VERSION
        return SHARED_VERSION if self.shared_tokens else TAILS_VERSION if self.memory_tokens > 1 else FORMAT_VERSION

    @property
    def has_key_sets(self) -> bool:
        return any(k is not None for k in self.key_sets)

    def save(self, path) -> Path:
        """Write ``path`` and ``path.json`` together and atomically (``write_files``)."""
        path = Path(path)
        fitted = [k for k in self.key_sets if k is not None]
        key_set_rows = [torch.cat([k.weight for k in fitted]), torch.cat([k.bias for k in fitted])] if fitted else []
        if not all(
            torch.isfinite(m).all() for m in (self.index, self.steer_matrix, self.tail, self.shared, *key_set_rows)
        ):
            raise BankError(f"refusing to save {path}: the bank has NaN/Inf rows (training diverged?)")
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.metadata(), indent=2, ensure_ascii=False)
        write_files(
            {
                path: lambda tmp: save_tensors(tmp, self.index, self.steer, self.tail, self.shared, *key_set_rows),
                metadata_path(path): lambda tmp: Path(tmp).write_text(text, encoding="utf-8"),
            }
        )
        return path

    @classmethod
    def load(cls, path, backbone=None) -> "MemoryBank":
        """Load and validate a bank; with ``backbone`` given, refuse a bank trained for another one."""
        path = Path(path)
        meta_file = existing_metadata(path)
        return cls.from_bytes(path.read_bytes(), meta_file.read_bytes(), backbone, where=path)

    @classmethod
    def from_bytes(
        cls, tensors: bytes, metadata: bytes, backbone=None, where="<bank>", require_backbone: bool = False
    ) -> "MemoryBank":
        """A bank from the contents of its two files, validated as ``load`` validates them (an upload is checked
        before anything is written); errors name ``where`` (the .safetensors path; the metadata's is ``where.json``).
        ``require_backbone``: the metadata must name the backbone's fingerprint (uploads)."""
        where = Path(where)
        meta = read_metadata(metadata, metadata_path(where))
        if require_backbone and "fingerprint" not in (meta.get("backbone") or {}):
            raise BankError(f"{metadata_path(where)}: field 'backbone' must give the backbone's 'fingerprint'")
        bank = cls(
            meta["hidden_size"],
            decoupled=meta["decoupled"],
            backbone=meta.get("backbone") or {},
            shows_schemas=meta.get("shows_schemas", False),  # absent before banks could show schemas
            memory_tokens=meta.get("memory_tokens", MEMORY_TOKENS),  # absent before a procedure could have several
            shared_tokens=meta.get("shared_tokens", SHARED_TOKENS),  # absent before banks could have shared rows
        )
        bank.names = list(meta["names"])
        bank._index_names()
        bank.descriptions = list(meta.get("descriptions") or [""] * len(bank.names))
        bank.kinds = list(meta.get("kinds") or ["text"] * len(bank.names))
        bank.index, bank.steer, bank.tail, bank.shared, weight, bias = read_tensors(tensors, where, meta)
        bank.trainable = torch.zeros(len(bank.names), dtype=torch.bool)
        bank.schemas = list(meta.get("schemas") or [None] * len(bank.names))  # none before schemas were kept
        bank.key_sets = _key_sets(meta.get("key_sets") or [None] * len(bank.names), weight, bias)
        bank.threshold = meta.get("threshold")  # absent before banks kept their own
        if backbone is not None:
            check_backbone(bank, backbone, where)
        return bank


def check_backbone(bank: MemoryBank, backbone, path="<bank>") -> None:
    expected = bank.backbone.get("fingerprint")
    actual = backbone.fingerprint()
    if bank.hidden_size != backbone.hidden_size or (expected and expected != actual):
        raise BankError(
            f"{path}: this bank was trained for backbone '{bank.backbone.get('name')}' "
            f"(width {bank.hidden_size}, fingerprint {expected}), not for '{backbone.name}' "
            f"(width {backbone.hidden_size}, fingerprint {actual}). Load it with --backbone {bank.backbone.get('name')}."
        )
    limit = ROW_NORM_FACTOR * backbone.embedding_norm()
    tail = [("tail", bank.tail)] if bank.memory_tokens > 1 else []
    shared = [("shared", bank.shared)] if bank.shared_tokens else []
    for key, matrix in [("index", bank.index), ("steer", bank.steer_matrix), *tail, *shared]:
        norms = matrix.norm(dim=-1)
        norms = norms.amax(-1) if norms.dim() > 1 else norms  # a tail's: per procedure, its largest
        large = (norms > limit).nonzero().flatten().tolist()
        if large:
            raise BankError(
                f"{path}: tensor '{key}' has rows {large[:5]} with norms over {limit:.4g} ({ROW_NORM_FACTOR:g} times "
                f"the backbone's mean embedding norm): such rows overflow the logits"
            )


def _key_sets(keys: list, weight: torch.Tensor, bias: torch.Tensor) -> list[KeySets | None]:
    """Per row, its ``KeySets`` from the metadata's key lists and the file's stacked rows (in row order)."""
    found, start = [], 0
    for row in keys:
        found.append(
            row and KeySets([tuple(k) for k in row], weight[start : start + len(row)], bias[start : start + len(row)])
        )
        start += len(row or ())
    return found


def _check_name(name) -> None:
    problem = name_problem(name)
    if problem:
        raise BankError(problem)


def _check_kind(kind) -> None:
    if kind not in KINDS:
        raise BankError(f"invalid row kind {kind!r}: choose from {', '.join(KINDS)}")
