"""Files: atomic writes (a crash never leaves half a file, nor one file of a set changed without the others), and data
files read with errors that name the file and line."""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from tokmem.errors import BankError, DataError


def atomic_write(path, write: Callable[[str], object]) -> Path:
    """``write(tmp)`` a temporary file beside ``path`` (hidden: ``.NAME.*.tmp``), then rename it to ``path``."""
    path = Path(path)
    tmp = _temporary_beside(path)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


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
            temporaries[path] = _temporary_beside(path)
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


def _temporary_beside(path: Path) -> str:
    """A new, empty, hidden temporary file beside ``path`` (``.NAME.*.tmp``)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    return tmp


def write_text_atomic(path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically, creating its folder if need be."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def write_json_atomic(path, data: dict) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")


def read_json(path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def read_text(path: Path) -> str:
    """A data file's text (gunzipped when its name ends in .gz), or a DataError that names the file and what is wrong."""
    try:
        data = path.read_bytes()
        return (gzip.decompress(data) if path.suffix == ".gz" else data).decode("utf-8")
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a folder, not a file") from None
    except (gzip.BadGzipFile, EOFError) as err:
        raise DataError(f"{path}: not a gzip file ({err})") from None
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None


def read_jsonl(path: Path) -> Iterator[tuple[int, object]]:
    """(line number, parsed JSON) for each non-blank line; a DataError names the file and line of bad JSON."""
    text = read_text(path)
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            yield number, json.loads(raw)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{number}: invalid JSON ({err.msg}, column {err.colno})") from None
