"""The server's banks: files in one directory, loaded on first use, a bounded number resident.

A bank named ``NAME`` is ``DIR/NAME.safetensors`` plus ``DIR/NAME.safetensors.json`` (the layout
``MemoryBank.save`` writes).  Each load or upload makes an immutable ``BankVersion``; a request holds
the version it started with, so replacing or deleting a bank never changes a running answer.
Uploads are validated from their bytes as ``MemoryBank.load`` validates files (``MemoryBank.from_bytes``) and
their tools' schemas compiled (``grammar.Grammars``, within the server's budget; the directory's own banks compile
without a time limit, outside the lock), then both files are written
together (``write_files``); a rejected upload leaves ``DIR`` as it was.  So every version's argument grammars are
compiled before any request decodes with it: the engine never compiles.

The directory is the source of truth: each use compares the files' size and modification time with
those of the resident version, and reloads a bank changed on disk or forgets one removed from it.

A request may name several banks joined by ``+`` (``travel+billing``): ``get`` composes them
(``tokmem.model.compose``: their rows one after another, procedure names unique) into one version that the engine
gathers per row like any bank; a composition is kept resident like a bank and made again when a part changes.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import stat as stat_module
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from tokmem.backbones import Backbone
from tokmem.bank.memory_bank import MemoryBank
from tokmem.bank.file_format import metadata_path
from tokmem.io import write_files
from tokmem.errors import BankError, clipped
from tokmem.decoding.grammar import grammars_for
from tokmem.model import TokMemModel, compose
from tokmem.schemas import Budget, SchemaError

log = logging.getLogger(__name__)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SUFFIX = ".safetensors"
JOIN = "+"  # joins the names of banks composed for one request
MAX_JOINED = 16  # banks one request may compose


class BankNotFound(BankError):
    """No bank of that name in the server's directory."""


class BankConflict(BankError):
    """Something that is not a bank file stands where an upload would be written (nothing was written)."""


class BankWriteError(BankError):
    """A valid upload could not be written (the directory is as it was)."""


class BankUnusable(BankError):
    """A bank file in the server's directory does not validate (the operator's to fix, not the client's)."""


@dataclass(frozen=True, eq=False)
class BankVersion:
    """One loaded version of a bank: its rows on the backbone's device, and the model for its names."""

    name: str
    revision: str  # digest of the two files: the same content gives the same revision
    model: TokMemModel  # the shared backbone with this bank (procedure names, memory ids, traces)
    index: torch.Tensor  # (rows, d) on the device, in the backbone's dtype
    steer: torch.Tensor  # (rows + tails, d): the input rows, then a bank's tails (``TokMemModel.memory_matrices``)
    stamp: tuple  # the two files' (size, mtime) when loaded (a composition: its parts' revisions); another: changed
    grammars: dict  # references (True/False) -> per row, its tool's compiled argument grammar or None

    @property
    def rows(self) -> int:
        return len(self.index)


class _Identity:
    """The backbone as ``MemoryBank.load`` checks it, with its fingerprint hashed once, not per upload."""

    def __init__(self, backbone: Backbone):
        self.name, self.hidden_size = backbone.name, backbone.hidden_size
        self._fingerprint, self._embedding_norm = backbone.fingerprint(), backbone.embedding_norm()

    def fingerprint(self) -> str:
        return self._fingerprint

    def embedding_norm(self) -> float:
        return self._embedding_norm


class BankRegistry:
    def __init__(self, backbone: Backbone, directory, max_resident: int = 256, budget: Budget = Budget()):
        self.backbone = backbone
        self.directory = Path(directory)
        self.max_resident = max_resident
        self._identity = _Identity(backbone)
        # requests' and uploads' schemas compile within the budget; the banks of the server's own directory are its
        # operator's: they compile however long they take (a time limit there locked a bank out for good on a busy CPU)
        self.grammars = grammars_for(backbone.tokenizer, backbone.vocab_size, budget)
        self.own_grammars = grammars_for(backbone.tokenizer, backbone.vocab_size, replace(budget, seconds=None))
        self._resident: OrderedDict[str, BankVersion] = OrderedDict()
        self._lock = threading.Lock()
        if not self.directory.is_dir():
            raise BankError(f"{self.directory}: bank directory not found")

    def names(self) -> list[str]:
        """Every bank in the directory (resident or not)."""
        return sorted(
            p.name[: -len(SUFFIX)]
            for p in self.directory.glob(f"*{SUFFIX}")
            if NAME.fullmatch(p.name[: -len(SUFFIX)]) and metadata_path(p).is_file()
        )

    def path(self, name: str) -> Path:
        check_name(name)
        return self.directory / f"{name}{SUFFIX}"

    @property
    def resident(self) -> int:
        return len(self._resident)

    def get(self, name: str) -> BankVersion:
        """The current version of a bank, loading it on first use or when its files changed on disk
        (least recently used ones leave); of several banks joined by ``+``, their composition."""
        if JOIN in name:
            return self._composed(name)
        path = self.path(name)
        with self._lock:
            version, now = self._resident.get(name), stamp(path)
            if now is None:
                self._resident.pop(name, None)
                raise BankNotFound(f"no bank named '{name}'")
            if version is not None and version.stamp == now:
                self._resident.move_to_end(name)
                return version
        version = self._load(name, path)  # outside the lock: its schemas may take long to compile
        with self._lock:
            self._keep(version)
            return version

    def _composed(self, name: str) -> BankVersion:
        names = name.split(JOIN)
        if len(names) > MAX_JOINED:
            raise BankError(
                f"a request may compose at most {MAX_JOINED} banks; {clipped(repr(name))} joins {len(names)}"
            )
        parts = [self.get(part) for part in names]
        revisions = tuple(part.revision for part in parts)
        with self._lock:
            version = self._resident.get(name)
            if version is None or version.stamp != revisions:
                version = _version(
                    name,
                    JOIN.join(revisions),
                    compose([part.model for part in parts], names),
                    revisions,
                    {ref: [g for part in parts for g in part.grammars[ref]] for ref in (True, False)},
                )
                self._keep(version)
            self._resident.move_to_end(name)
            return version

    def put(self, name: str, tensors: bytes, metadata: bytes) -> BankVersion:
        """Validate an uploaded bank (its safetensors and JSON) from its bytes, write it and make it current."""
        path = self.path(name)
        try:
            bank = MemoryBank.from_bytes(
                tensors, metadata, backbone=self._identity, where=path.name, require_backbone=True
            )
            grammars = self._compile(bank, self.grammars)
        except (BankError, SchemaError) as err:
            raise BankError(f"upload of bank '{name}': {err}") from None
        with self._lock:
            try:
                write_files(
                    {
                        path: lambda tmp: Path(tmp).write_bytes(tensors),
                        metadata_path(path): lambda tmp: Path(tmp).write_bytes(metadata),
                    }
                )
            except BankError:
                raise BankConflict(
                    f"bank '{name}' cannot be written: its name is taken by something that is not a bank file"
                ) from None
            except OSError as err:
                raise BankWriteError(
                    f"bank '{name}' could not be written ({type(err).__name__}); nothing changed"
                ) from err
            version = _version(
                name, revision(tensors, metadata), TokMemModel(self.backbone, bank), stamp(path), grammars
            )
            self._keep(version)
            return version

    def delete(self, name: str) -> None:
        path = self.path(name)
        with self._lock:
            if not path.is_file():
                raise BankNotFound(f"no bank named '{name}'")
            path.unlink()
            metadata_path(path).unlink(missing_ok=True)
            self._resident.pop(name, None)

    @staticmethod
    def _compile(bank: MemoryBank, grammars) -> dict:
        """Each tool row's argument grammars, with and without references (``BankVersion.grammars``); a schema that
        cannot compile is a ``SchemaError`` naming its row, field and keyword."""
        return {
            references: grammars.rows(bank.schemas, references, key_sets=bank.key_sets) for references in (True, False)
        }

    def _load(self, name: str, path: Path) -> BankVersion:
        """The version of a bank in the directory, read, validated and its schemas compiled."""
        when = stamp(path)
        tensors, metadata = path.read_bytes(), metadata_path(path).read_bytes()
        try:
            bank = MemoryBank.from_bytes(tensors, metadata, backbone=self._identity, where=path.name)
            grammars = self._compile(bank, self.own_grammars)
        except (BankError, SchemaError) as err:
            log.error("bank '%s' in %s does not validate: %s", name, self.directory, err)
            raise BankUnusable(f"bank '{name}' on this server does not validate (see the server log)") from None
        return _version(name, revision(tensors, metadata), TokMemModel(self.backbone, bank), when, grammars)

    def _keep(self, version: BankVersion) -> None:
        """Make ``version`` resident, the most recently used (the least recently used leave)."""
        self._resident[version.name] = version
        self._resident.move_to_end(version.name)
        while len(self._resident) > self.max_resident:
            self._resident.popitem(last=False)


def _version(name: str, digest: str, model: TokMemModel, when, grammars: dict) -> BankVersion:
    """The version of ``model``'s bank, its rows laid out as the model embeds and scores them
    (``TokMemModel.memory_matrices``: the tails of a bank of several memory tokens a tool after its rows), on the
    backbone's device and in its dtype."""
    dtype = model.backbone.model.dtype
    index, steer = (matrix.to(dtype) for matrix in model.memory_matrices())
    return BankVersion(name, digest, model, index, steer, when, grammars)


def check_name(name: str) -> None:
    if not NAME.fullmatch(name) or ".." in name:
        raise BankError(
            f"invalid bank name {clipped(repr(name))}: use 1-64 letters, digits, '.', '_' or '-', starting with a "
            "letter or digit, without '..'"
        )


def stamp(path: Path) -> tuple | None:
    """(size, mtime) of a bank's two files, or None when either is missing or not a file."""
    try:
        stats = [os.stat(p) for p in (path, metadata_path(path))]
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not all(stat_module.S_ISREG(s.st_mode) for s in stats):
        return None
    return tuple((s.st_size, s.st_mtime_ns) for s in stats)


def revision(tensors: bytes, metadata: bytes) -> str:
    """A bank's revision: the digest of its two files."""
    return hashlib.sha256(tensors + b"\0" + metadata).hexdigest()[:16]
