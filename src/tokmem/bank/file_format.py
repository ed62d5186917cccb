"""The bank file format: what a bank's two files hold, and the checks of what is read from them.

A bank is ``<path>`` (safetensors, tensors only, never pickle: ``index``, and ``steer`` for a decoupled bank, float32,
one row a procedure; ``tail`` for a bank of several memory tokens a procedure, (procedures, tokens - 1, width);
``shared`` for a bank with shared rows, (shared tokens, width); ``key_set_weight`` (key sets, width) and
``key_set_bias`` (key sets,) for a bank with key-set rows, every tool's in row order) plus ``<path>.json`` (format version, names, descriptions, kinds, schemas, dims, DC flag, memory tokens, backbone
identity, norm statistics).  Version 1 files (before kinds) load with every row ``text``; version 3 is a bank with
tails (written so only then, so that a tokmem that cannot lay them out refuses it rather than answer without them),
version 4 one with shared rows, version 5 one with key-set rows (the same reason).
Every metadata field is checked by one small function (``FIELD_CHECKS``) before anything is built from it, so a bad
file or upload gets one clear error, never a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save_file

from tokmem.errors import BankError

FORMAT = "tokmem-bank"
FORMAT_VERSION = 2
TAILS_VERSION = 3  # a bank of several memory tokens a procedure: a reader that knows no tails must refuse it
SHARED_VERSION = 4  # a bank with shared rows: a reader that knows none must refuse it
KEY_SETS_VERSION = 5  # a bank with key-set rows: a reader that knows none would decode without them
READABLE_VERSIONS = (1, 2, 3, 4, 5)
KINDS = ("text", "tool")
MAX_NAME_CHARS = 128  # a procedure name's length
MAX_HIDDEN_SIZE = 2**16
MEMORY_TOKENS = 1  # a procedure's memory tokens, by default and in files from before the field: one (the paper's)
MAX_MEMORY_TOKENS = 64  # a procedure's memory tokens, at most
SHARED_TOKENS = 0  # a bank's shared rows, by default and in files from before the field: none (the paper's)
MAX_SHARED_TOKENS = 64  # a bank's shared rows, at most


def metadata_path(path) -> Path:
    """The metadata file beside the bank file ``path``: ``<path>.json``."""
    path = Path(path)
    return path.with_name(path.name + ".json")


def read_backbone_name(path) -> str:
    """The backbone spec a bank file was trained for (from its metadata)."""
    meta_file = existing_metadata(Path(path))
    meta = read_metadata(meta_file.read_bytes(), meta_file)
    name = (meta.get("backbone") or {}).get("name")
    if not name:
        raise BankError(f"{metadata_path(path)}: field 'backbone.name' is missing; pass the backbone explicitly")
    return name


def existing_metadata(path: Path) -> Path:
    """The metadata file of the bank ``path``, after checking that both files exist."""
    meta_file = metadata_path(path)
    if not path.is_file():
        raise BankError(f"{path}: bank file not found")
    if not meta_file.is_file():
        raise BankError(f"{meta_file}: bank metadata not found (a bank is the .safetensors file plus its .json)")
    return meta_file


def save_tensors(
    tmp: str,
    index: torch.Tensor,
    steer: torch.Tensor | None,
    tail: torch.Tensor,
    shared: torch.Tensor,
    key_set_weight: torch.Tensor | None = None,
    key_set_bias: torch.Tensor | None = None,
) -> None:
    """Write a bank's rows to the safetensors file ``tmp``: ``index``, ``steer`` when the bank is decoupled, ``tail``
    when it has several memory tokens a procedure, ``shared`` when it has shared rows, the key-set rows where given."""
    tensors = {"index": index.contiguous()}
    if steer is not None:
        tensors["steer"] = steer.contiguous()
    if tail.shape[1]:
        tensors["tail"] = tail.contiguous()
    if shared.shape[0]:
        tensors["shared"] = shared.contiguous()
    if key_set_weight is not None:
        tensors["key_set_weight"], tensors["key_set_bias"] = key_set_weight.contiguous(), key_set_bias.contiguous()
    save_file(tensors, tmp, metadata={"format": FORMAT})


def read_tensors(data: bytes, path: Path, meta: dict) -> tuple[torch.Tensor, ...]:
    """The ``index``, (decoupled banks) ``steer``, ``tail``, ``shared``, ``key_set_weight`` and ``key_set_bias`` rows
    of a safetensors file's bytes, each checked against the metadata ``meta`` (shape, dtype, finite values); errors
    name ``path``."""
    try:
        tensors = load(data)
    except (SafetensorError, OSError, ValueError) as err:
        raise BankError(f"{path}: corrupted or truncated bank file ({err})") from None
    rows, width, tails = len(meta["names"]), meta["hidden_size"], meta.get("memory_tokens", MEMORY_TOKENS) - 1
    index = _checked(tensors, "index", path, meta, (rows, width))
    steer = _checked(tensors, "steer", path, meta, (rows, width)) if meta["decoupled"] else None
    tail = _checked(tensors, "tail", path, meta, (rows, tails, width)) if tails else torch.empty(rows, 0, width)
    shared_tokens = meta.get("shared_tokens", SHARED_TOKENS)
    shared = _checked(tensors, "shared", path, meta, (shared_tokens, width)) if shared_tokens else torch.empty(0, width)
    key_sets = sum(len(row or ()) for row in meta.get("key_sets") or ())
    weight = _checked(tensors, "key_set_weight", path, meta, (key_sets, width)) if key_sets else torch.empty(0, width)
    bias = _checked(tensors, "key_set_bias", path, meta, (key_sets,)) if key_sets else torch.empty(0)
    return index, steer, tail, shared, weight, bias


def read_metadata(text: bytes, meta_file: Path) -> dict:
    """The metadata JSON ``text``, every field checked (``FIELD_CHECKS``); errors name ``meta_file``."""
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


def name_problem(name) -> str | None:
    if not isinstance(name, str) or not name.strip() or name != name.strip() or len(name) > MAX_NAME_CHARS:
        return f"invalid procedure name {name!r:.60}: use a non-empty text of at most {MAX_NAME_CHARS} characters without surrounding spaces"
    return None


# ---- metadata fields: each check returns what is wrong, or None; they run in this order -----------------
def _format(meta: dict) -> str | None:
    if meta.get("format") != FORMAT:
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


def _shows_schemas(meta: dict) -> str | None:
    shows = meta.get("shows_schemas", False)
    return None if isinstance(shows, bool) else "field 'shows_schemas' must be true or false"


def _memory_tokens(meta: dict) -> str | None:
    tokens = meta.get("memory_tokens", MEMORY_TOKENS)
    if type(tokens) is not int or not 1 <= tokens <= MAX_MEMORY_TOKENS:
        return f"field 'memory_tokens' must be a whole number from 1 to {MAX_MEMORY_TOKENS}, not {tokens!r:.40}"
    return None


def _shared_tokens(meta: dict) -> str | None:
    tokens = meta.get("shared_tokens", SHARED_TOKENS)
    if type(tokens) is not int or not 0 <= tokens <= MAX_SHARED_TOKENS:
        return f"field 'shared_tokens' must be a whole number from 0 to {MAX_SHARED_TOKENS}, not {tokens!r:.40}"
    return None


def _names(meta: dict) -> str | None:
    names = meta.get("names")
    if not isinstance(names, list):
        return "field 'names' is missing or not a list"
    for row, name in enumerate(names):
        problem = name_problem(name)
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


def _key_sets(meta: dict) -> str | None:
    """Absent, or per row null or a list of two or more distinct key sets, each a list of distinct strings."""
    key_sets = meta.get("key_sets")
    if key_sets is None:
        return None
    if not isinstance(key_sets, list) or len(key_sets) != len(meta["names"]):
        return "field 'key_sets' must be a list with one entry per row"
    for row, entry in enumerate(key_sets):
        if entry is None:
            continue
        where = f"field 'key_sets'[{row}]"
        if not isinstance(entry, list) or len(entry) < 2:
            return f"{where} must be null or a list of at least two key sets"
        for keys in entry:
            if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys) or len(set(keys)) != len(keys):
                return f"{where}: each key set must be a list of distinct strings"
        if len({frozenset(keys) for keys in entry}) != len(entry):
            return f"{where}: a key set is listed twice"
    return None


def _threshold(meta: dict) -> str | None:
    """Absent, or the open-set threshold the bank decodes with: a number from 0 to 1."""
    threshold = meta.get("threshold")
    if threshold is None or (
        isinstance(threshold, (int, float)) and not isinstance(threshold, bool) and 0 <= threshold <= 1
    ):
        return None
    return "field 'threshold' must be a number from 0 to 1"


FIELD_CHECKS: tuple[Callable[[dict], str | None], ...] = (
    _format,
    _hidden_size,
    _decoupled,
    _shows_schemas,
    _memory_tokens,
    _shared_tokens,
    _names,
    _descriptions,
    _kinds,
    _schemas,
    _key_sets,
    _threshold,
    _backbone,
)


def _checked(tensors: dict, key: str, path: Path, meta: dict, expected: tuple[int, ...]) -> torch.Tensor:
    if key not in tensors:
        raise BankError(f"{path}: tensor '{key}' is missing")
    tensor = tensors[key]
    if tuple(tensor.shape) != expected:
        raise BankError(f"{path}: tensor '{key}' has shape {tuple(tensor.shape)}, the metadata says {expected}")
    if tensor.dtype != torch.float32:
        raise BankError(f"{path}: tensor '{key}' has dtype {tensor.dtype}, expected float32")
    infinite = ~torch.isfinite(tensor)
    bad = (infinite.flatten(1).any(dim=1) if tensor.dim() > 1 else infinite).nonzero().flatten().tolist()
    if bad:
        procedures = key in ("index", "steer", "tail")  # shared and key-set rows are not one a procedure
        named = f" ({', '.join(meta['names'][i] for i in bad[:5])})" if procedures else ""
        raise BankError(f"{path}: tensor '{key}' has NaN/Inf values in rows {bad[:5]}{named}")
    return tensor
