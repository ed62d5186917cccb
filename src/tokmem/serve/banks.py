"""The server's banks: files in one directory, loaded on first use, a bounded number resident.

A bank named ``NAME`` is ``DIR/NAME.safetensors`` plus ``DIR/NAME.safetensors.json`` (the layout
``MemoryBank.save`` writes).  Each load or upload makes an immutable ``BankVersion``; a request holds
the version it started with, so replacing or deleting a bank never changes a running answer.
Uploads are validated from their bytes as ``MemoryBank.load`` validates files (``MemoryBank.from_bytes``),
then each file is written to a hidden temporary file in ``DIR`` and renamed into place; a rejected upload
leaves ``DIR`` as it was.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch

from tokmem.backbones import Backbone
from tokmem.bank import MemoryBank, metadata_path
from tokmem.io import atomic_write
from tokmem.errors import BankError
from tokmem.model import TokMemModel

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SUFFIX = ".safetensors"


class BankNotFound(BankError):
    """No bank of that name in the server's directory."""


@dataclass(frozen=True, eq=False)
class BankVersion:
    """One loaded version of a bank: its rows on the backbone's device, and the model for its names."""

    name: str
    revision: str  # digest of the two files: the same content gives the same revision
    model: TokMemModel  # the shared backbone with this bank (procedure names, memory ids, traces)
    index: torch.Tensor  # (rows, d) on the device, in the backbone's dtype
    steer: torch.Tensor

    @property
    def rows(self) -> int:
        return len(self.index)


class _Identity:
    """The backbone as ``MemoryBank.load`` checks it, with its fingerprint hashed once, not per upload."""

    def __init__(self, backbone: Backbone):
        self.name, self.hidden_size = backbone.name, backbone.hidden_size
        self._fingerprint = backbone.fingerprint()

    def fingerprint(self) -> str:
        return self._fingerprint


class BankRegistry:
    def __init__(self, backbone: Backbone, directory, max_resident: int = 256):
        self.backbone = backbone
        self.directory = Path(directory)
        self.max_resident = max_resident
        self._identity = _Identity(backbone)
        self._resident: OrderedDict[str, BankVersion] = OrderedDict()
        self._lock = threading.Lock()
        if not self.directory.is_dir():
            raise BankError(f"{self.directory}: bank directory not found")

    def names(self) -> list[str]:
        """Every bank in the directory (resident or not)."""
        return sorted(
            p.name[: -len(SUFFIX)] for p in self.directory.glob(f"*{SUFFIX}")
            if NAME.fullmatch(p.name[: -len(SUFFIX)]) and metadata_path(p).is_file()
        )

    def path(self, name: str) -> Path:
        check_name(name)
        return self.directory / f"{name}{SUFFIX}"

    @property
    def resident(self) -> int:
        return len(self._resident)

    def get(self, name: str) -> BankVersion:
        """The current version of a bank, loading it on first use (least recently used ones leave)."""
        path = self.path(name)
        with self._lock:
            version = self._resident.get(name)
            if version is None:
                if not path.is_file():
                    raise BankNotFound(f"no bank named '{name}' (the server has: {', '.join(self.names()) or 'none'})")
                version = self._install(name, path)
            self._resident.move_to_end(name)
            return version

    def put(self, name: str, tensors: bytes, metadata: bytes) -> BankVersion:
        """Validate an uploaded bank (its safetensors and JSON) from its bytes, write it and make it current."""
        path = self.path(name)
        try:
            bank = MemoryBank.from_bytes(tensors, metadata, backbone=self._identity, where=path.name)
        except BankError as err:
            raise BankError(f"upload of bank '{name}': {err}") from None
        with self._lock:
            atomic_write(metadata_path(path), lambda tmp: Path(tmp).write_bytes(metadata))
            atomic_write(path, lambda tmp: Path(tmp).write_bytes(tensors))
            return self._install(name, path, bank, revision(tensors, metadata))

    def delete(self, name: str) -> None:
        path = self.path(name)
        with self._lock:
            if not path.is_file():
                raise BankNotFound(f"no bank named '{name}'")
            path.unlink()
            metadata_path(path).unlink(missing_ok=True)
            self._resident.pop(name, None)

    def _install(self, name, path, bank=None, digest=None) -> BankVersion:
        if bank is None:
            bank = MemoryBank.load(path, backbone=self._identity)
            digest = revision(path.read_bytes(), metadata_path(path).read_bytes())
        device, dtype = self.backbone.device, self.backbone.model.dtype
        version = BankVersion(
            name, digest, TokMemModel(self.backbone, bank),
            bank.index.to(device, dtype), bank.steer_matrix.to(device, dtype),
        )
        self._resident[name] = version
        self._resident.move_to_end(name)
        while len(self._resident) > self.max_resident:
            self._resident.popitem(last=False)
        return version


def check_name(name: str) -> None:
    if not NAME.fullmatch(name) or ".." in name:
        raise BankError(
            f"invalid bank name {name!r}: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit, without '..'"
        )


def revision(tensors: bytes, metadata: bytes) -> str:
    """A bank's revision: the digest of its two files."""
    return hashlib.sha256(tensors + b"\0" + metadata).hexdigest()[:16]
