"""The result files under ``results/``: JSON, kept compressed with xz (``.json.xz``) where per-step samples make one
large (xz, not gzip: a file's variants repeat the same records' tool results further apart than gzip's window)."""

from __future__ import annotations

import json
import lzma
from pathlib import Path


def read_result(path) -> dict:
    """A result file's JSON, decompressed first when its name ends in ``.xz``."""
    data = Path(path).read_bytes()
    return json.loads(lzma.decompress(data) if str(path).endswith(".xz") else data)
