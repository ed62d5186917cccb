"""MemoryBank: the named memory rows, their trainable/frozen split, renormalisation, and the bank file.

A coupled bank has one matrix used both as input embeddings (steering) and as LM-head rows (indexing).
A decoupled (DC) bank keeps a separate ``steer`` matrix for the input side; ``index`` is always the
LM-head side.  Rows are float32 on the CPU; the model moves them where they are needed.

Each row has a kind: ``text`` (its memory token is followed by the response text) or ``tool`` (it is
followed by the tool's arguments as JSON only: the memory token is the tool choice, and answers
assemble the whole call ``{"name": procedure, "arguments": …}``).  A tool row may keep its tool's JSON schema
(``schemas``: OpenAI's function ``parameters``), which binds the arguments decoded after its memory token.

On disk a bank is ``<path>`` (safetensors, tensors only, never pickle) plus ``<path>.json``
(format version, names, descriptions, kinds, schemas, dims, DC flag, backbone identity, norm statistics).
Version 1 files (before kinds) load with every row ``text``.  Every metadata field is checked by one
small function (``FIELD_CHECKS``) before anything is built from it, so a bad file or upload gets one
clear error, never a traceback.  The two files are written together: both temporaries first, then
both renamed, the first one put back if the second rename fails.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save_file

from tokmem.errors import BankError, cut, listed

FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
KINDS = ("text", "tool")
MAX_NAME_CHARS = 128  # a procedure name's length
MAX_HIDDEN_SIZE = 2**16
ROW_NORM_FACTOR = 1000.0  # rows may be at most this many times the backbone's mean embedding norm


class MemoryBank:
    def __init__(self, hidden_size: int, decoupled: bool = False, backbone: dict | None = None):
        self.hidden_size = hidden_size
        self.names: list[str] = []  # edited only here, with _index_names() after each change
        self._rows: dict[str, int] = {}
        self.descriptions: list[str] = []
        self.kinds: list[str] = []
        self.schemas: list[dict | None] = []  # per row: its tool's JSON schema, or None
        self.index = torch.empty(0, hidden_size)
        self.steer = torch.empty(0, hidden_size) if decoupled else None
        self.trainable = torch.empty(0, dtype=torch.bool)
        self.backbone = backbone or {}

    # ---- shape and lookup ---------------------------------------------------------------
    @property
    def decoupled(self) -> bool:
        return self.steer is not None

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
                f"no procedure {cut(repr(name))} in the bank (it has: {listed(self.names) or 'none'})"
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

    def frozen_rows(self) -> torch.Tensor:
        return (~self.trainable).nonzero().flatten()

    def parameter_count(self, trainable_only: bool = False) -> int:
        rows = int(self.trainable.sum()) if trainable_only else len(self)
        return rows * self.hidden_size * (2 if self.decoupled else 1)

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
        self.names += names
        self.descriptions += descriptions
        self.kinds += kinds
        self.schemas += schemas
        self._index_names()
        self.index = torch.cat([self.index, rows])
        if self.decoupled:
            self.steer = torch.cat([self.steer, rows.clone()])
        self.trainable = torch.cat([self.trainable, torch.ones(len(names), dtype=torch.bool)])
        return list(range(start, len(self)))

    def freeze(self) -> None:
        self.trainable[:] = False

    def remove(self, name: str) -> None:
        keep = torch.tensor([n != name for n in self.names])
        row = self.row(name)
        del self.names[row], self.descriptions[row], self.kinds[row], self.schemas[row]
        self._index_names()
        self.index = self.index[keep]
        if self.decoupled:
            self.steer = self.steer[keep]
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
        self._index_names()
        self.index = torch.cat([self.index, other.index])
        if self.decoupled:
            self.steer = torch.cat([self.steer, other.steer])
        self.trainable = torch.cat([self.trainable, other.trainable])

    # ---- renormalisation ----------------------------------------------------------------
    def norms(self) -> torch.Tensor:
        return self.index.norm(dim=1)

    def renormalize(self, new_rows, eps: float = 1e-8) -> float | None:
        """Rescale ``new_rows`` of the index matrix to the mean L2 norm of every other row.

        m_i <- m_i * n_I / (||m_i|| + eps), n_I the mean norm of the existing rows (the paper's Eq. 4).
        DC banks renormalise the index matrix only.  Returns n_I, or None when there are no existing rows.
        """
        new_rows = torch.as_tensor(new_rows, dtype=torch.long)
        existing = torch.ones(len(self), dtype=torch.bool)
        existing[new_rows] = False
        if not existing.any() or len(new_rows) == 0:
            return None
        target = self.index[existing].norm(dim=1).mean()
        rows = self.index[new_rows]
        self.index[new_rows] = rows * (target / (rows.norm(dim=1, keepdim=True) + eps))
        return float(target)

    # ---- files ------------------------------------------------------------------------------
    def metadata(self) -> dict:
        norms = self.norms()
        return {
            "format": "tokmem-bank",
            "format_version": FORMAT_VERSION,
            "hidden_size": self.hidden_size,
            "num_rows": len(self),
            "decoupled": self.decoupled,
            "dtype": "float32",
            "names": self.names,
            "descriptions": self.descriptions,
            "kinds": self.kinds,
            "schemas": self.schemas,
            "backbone": self.backbone,
            "norms": {
                "mean": float(norms.mean()) if len(self) else None,
                "min": float(norms.min()) if len(self) else None,
                "max": float(norms.max()) if len(self) else None,
                "per_row": [round(float(n), 6) for n in norms],
            },
        }

    def save(self, path) -> Path:
        """Write ``path`` and ``path.json`` together and atomically (``write_files``)."""
        path = Path(path)
        if not all(torch.isfinite(m).all() for m in (self.index, self.steer_matrix)):
            raise BankError(f"refusing to save {path}: the bank has NaN/Inf rows (training diverged?)")
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = {"index": self.index.contiguous()}
        if self.decoupled:
            tensors["steer"] = self.steer.contiguous()
        text = json.dumps(self.metadata(), indent=2, ensure_ascii=False)
        write_files(
            {
                path: lambda tmp: save_file(tensors, tmp, metadata={"format": "tokmem-bank"}),
                metadata_path(path): lambda tmp: Path(tmp).write_text(text, encoding="utf-8"),
            }
        )
        return path

    @classmethod
    def load(cls, path, backbone=None) -> "MemoryBank":
        """Load and validate a bank; with ``backbone`` given, refuse a bank trained for another one."""
        path = Path(path)
        meta_file = _existing_metadata(path)
        return cls.from_bytes(path.read_bytes(), meta_file.read_bytes(), backbone, where=path)

    @classmethod
    def from_bytes(
        cls, tensors: bytes, metadata: bytes, backbone=None, where="<bank>", require_backbone: bool = False
    ) -> "MemoryBank":
        """A bank from the contents of its two files, validated as ``load`` validates them (an upload is checked
        before anything is written); errors name ``where`` (the .safetensors path; the metadata's is ``where.json``).
        ``require_backbone``: the metadata must name the backbone's fingerprint (uploads)."""
        where = Path(where)
        meta = _parse_metadata(metadata, metadata_path(where))
        if require_backbone and "fingerprint" not in (meta.get("backbone") or {}):
            raise BankError(f"{metadata_path(where)}: field 'backbone' must give the backbone's 'fingerprint'")
        tensors = _parse_tensors(tensors, where)
        bank = cls(meta["hidden_size"], decoupled=meta["decoupled"], backbone=meta.get("backbone") or {})
        bank.names = list(meta["names"])
        bank._index_names()
        bank.descriptions = list(meta.get("descriptions") or [""] * len(bank.names))
        bank.kinds = list(meta.get("kinds") or ["text"] * len(bank.names))
        bank.index = _checked(tensors, "index", where, meta)
        if bank.decoupled:
            bank.steer = _checked(tensors, "steer", where, meta)
        bank.trainable = torch.zeros(len(bank.names), dtype=torch.bool)
        bank.schemas = list(meta.get("schemas") or [None] * len(bank.names))  # none before schemas were kept
        if backbone is not None:
            check_backbone(bank, backbone, where)
        return bank


def metadata_path(path) -> Path:
    path = Path(path)
    return path.with_name(path.name + ".json")


def read_backbone_name(path) -> str:
    """The backbone spec a bank file was trained for (from its metadata)."""
    meta_file = _existing_metadata(Path(path))
    meta = _parse_metadata(meta_file.read_bytes(), meta_file)
    name = (meta.get("backbone") or {}).get("name")
    if not name:
        raise BankError(f"{metadata_path(path)}: field 'backbone.name' is missing; pass the backbone explicitly")
    return name


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
    for key, matrix in (("index", bank.index), ("steer", bank.steer_matrix)):
        large = (matrix.norm(dim=1) > limit).nonzero().flatten().tolist()
        if large:
            raise BankError(
                f"{path}: tensor '{key}' has rows {large[:5]} with norms over {limit:.4g} ({ROW_NORM_FACTOR:g} times "
                f"the backbone's mean embedding norm): such rows overflow the logits"
            )


def schemas_problem(schemas, rows: int) -> str | None:
    """What is wrong with per-row tool ``schemas``, worded to follow their name (``[1] must be …``), or None.

    They must be a list with, per row, None or a JSON schema object whose ``properties`` (if any) is an object
    and whose ``required`` (if any) lists strings."""
    if not isinstance(schemas, list) or len(schemas) != rows:
        return f" must be a list of {rows} entries (a JSON schema or null per row)"
    for row, schema in enumerate(schemas):
        if schema is None:
            continue
        if not isinstance(schema, dict):
            return f"[{row}] must be a JSON schema object or null, not {type(schema).__name__}"
        if not isinstance(schema.get("properties", {}), dict):
            return f"[{row}].properties must be an object"
        required = schema.get("required", [])
        if not isinstance(required, list) or not all(isinstance(key, str) for key in required):
            return f"[{row}].required must be a list of argument names"
    return None


def _check_name(name) -> None:
    problem = _name_problem(name)
    if problem:
        raise BankError(problem)


def _name_problem(name) -> str | None:
    if not isinstance(name, str) or not name.strip() or name != name.strip() or len(name) > MAX_NAME_CHARS:
        return f"invalid procedure name {name!r:.60}: use a non-empty text of at most {MAX_NAME_CHARS} characters without surrounding spaces"
    return None


def _check_kind(kind) -> None:
    if kind not in KINDS:
        raise BankError(f"invalid row kind {kind!r}: choose from {', '.join(KINDS)}")


def write_files(writers: dict[Path, Callable[[str], None]]) -> None:
    """Write several files as one change: ``write(tmp)`` each to a hidden temporary beside its path
    (``.NAME.*.tmp``), then rename them all into place.  On any failure no temporary is left and no file
    has changed: a target that is not a plain file is refused first, and files already renamed are put
    back from hard-linked copies of what they were."""
    for path in writers:
        if path.exists() and not path.is_file():
            raise BankError(f"{path} exists and is not a file: nothing written")
    temporaries = {}
    try:
        for path, write in writers.items():
            fd, temporaries[path] = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            os.close(fd)
            write(temporaries[path])
        _rename_all(temporaries)
    finally:
        for tmp in temporaries.values():
            Path(tmp).unlink(missing_ok=True)


def _rename_all(temporaries: dict[Path, str]) -> None:
    """Rename each temporary to its path; if one rename fails, put back the paths already renamed."""
    backups: dict[Path, Path] = {}  # hard-linked copies of the files being replaced
    renamed: list[Path] = []
    try:
        for path, tmp in temporaries.items():
            if path.exists():
                backups[path] = Path(f"{tmp}.old")
                os.link(path, backups[path])
            os.replace(tmp, path)
            renamed.append(path)
    except BaseException:
        for path in reversed(renamed):
            if path in backups:
                os.replace(backups[path], path)
            else:
                path.unlink(missing_ok=True)
        raise
    finally:
        for backup in backups.values():
            backup.unlink(missing_ok=True)


def _existing_metadata(path: Path) -> Path:
    """The metadata file of the bank ``path``, after checking that both files exist."""
    meta_file = metadata_path(path)
    if not path.is_file():
        raise BankError(f"{path}: bank file not found")
    if not meta_file.is_file():
        raise BankError(f"{meta_file}: bank metadata not found (a bank is the .safetensors file plus its .json)")
    return meta_file


def _parse_metadata(text: bytes, meta_file: Path) -> dict:
    try:
        meta = json.loads(text.decode("utf-8"))
    except (ValueError, RecursionError) as err:  # bad JSON or UTF-8, huge numbers, deep nesting
        raise BankError(f"{meta_file}: corrupted metadata ({type(err).__name__}: {str(err)[:200]})") from None
    if not isinstance(meta, dict):
        raise BankError(f"{meta_file}: not a tokmem bank metadata file")
    for check in FIELD_CHECKS:
        problem = check(meta)
        if problem:
            raise BankError(f"{meta_file}: {problem}")
    return meta


# ---- metadata fields: each check returns what is wrong, or None; they run in this order -----------------
def _format(meta: dict) -> str | None:
    if meta.get("format") != "tokmem-bank":
        return "not a tokmem bank metadata file"
    if meta.get("format_version") not in READABLE_VERSIONS or isinstance(meta.get("format_version"), bool):
        return (
            f"bank format version {meta.get('format_version')} is not supported "
            f"(this tokmem reads versions {', '.join(map(str, READABLE_VERSIONS))})"
        )
    return None


def _hidden_size(meta: dict) -> str | None:
    size = meta.get("hidden_size")
    if type(size) is not int or not 0 < size <= MAX_HIDDEN_SIZE:
        return f"field 'hidden_size' must be a whole number from 1 to {MAX_HIDDEN_SIZE}, not {size!r:.40}"
    return None


def _decoupled(meta: dict) -> str | None:
    return None if isinstance(meta.get("decoupled"), bool) else "field 'decoupled' is missing or not true/false"


def _names(meta: dict) -> str | None:
    names = meta.get("names")
    if not isinstance(names, list):
        return "field 'names' is missing or not a list"
    for row, name in enumerate(names):
        problem = _name_problem(name)
        if problem:
            return f"field 'names', row {row}: {problem}"
    return "field 'names' has duplicates" if len(set(names)) != len(names) else None


def _descriptions(meta: dict) -> str | None:
    descriptions, count = meta.get("descriptions"), len(meta["names"])
    if descriptions is None:
        return None
    if (
        not isinstance(descriptions, list)
        or len(descriptions) != count
        or not all(isinstance(d, str) for d in descriptions)
    ):
        return f"field 'descriptions' must list one text for each of the {count} names"
    return None


def _kinds(meta: dict) -> str | None:
    kinds, count = meta.get("kinds"), len(meta["names"])
    if kinds is not None and (not isinstance(kinds, list) or len(kinds) != count or not all(k in KINDS for k in kinds)):
        return f"field 'kinds' must list one of {', '.join(KINDS)} for each of the {count} names"
    return None


def _backbone(meta: dict) -> str | None:
    backbone = meta.get("backbone")
    if backbone is None:
        return None
    if not isinstance(backbone, dict):
        return "field 'backbone' must be an object with the backbone's 'name' and 'fingerprint'"
    for key in ("name", "fingerprint"):
        if key in backbone and not (isinstance(backbone[key], str) and backbone[key]):
            return f"field 'backbone.{key}' must be a non-empty text"
    return None


def _schemas(meta: dict) -> str | None:
    if meta.get("schemas") is None:
        return None
    problem = schemas_problem(meta["schemas"], len(meta["names"]))
    return problem and f"field 'schemas'{problem}"


FIELD_CHECKS: tuple[Callable[[dict], str | None], ...] = (
    _format,
    _hidden_size,
    _decoupled,
    _names,
    _descriptions,
    _kinds,
    _schemas,
    _backbone,
)


def _parse_tensors(data: bytes, path: Path) -> dict:
    try:
        return load(data)
    except (SafetensorError, OSError, ValueError) as err:
        raise BankError(f"{path}: corrupted or truncated bank file ({err})") from None


def _checked(tensors: dict, key: str, path: Path, meta: dict) -> torch.Tensor:
    if key not in tensors:
        raise BankError(f"{path}: tensor '{key}' is missing")
    tensor = tensors[key]
    expected = (len(meta["names"]), meta["hidden_size"])
    if tuple(tensor.shape) != expected:
        raise BankError(f"{path}: tensor '{key}' has shape {tuple(tensor.shape)}, the metadata says {expected}")
    if tensor.dtype != torch.float32:
        raise BankError(f"{path}: tensor '{key}' has dtype {tensor.dtype}, expected float32")
    bad = (~torch.isfinite(tensor)).any(dim=1).nonzero().flatten().tolist()
    if bad:
        names = [meta["names"][i] for i in bad[:5]]
        raise BankError(f"{path}: tensor '{key}' has NaN/Inf values in rows {bad[:5]} ({', '.join(names)})")
    return tensor
