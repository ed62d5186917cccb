"""The project's shared data (SNI tasks, function-calling files, GSM8K, the paper), found one way.

``$TOKMEM_SHARED_DATA`` names the shared data folder; without it, the first ``shared/data`` folder in the
working directory or one of its parents (``../shared/data`` beside a checkout) is used.
"""

from __future__ import annotations

import os
from pathlib import Path

SHARED_ENV = "TOKMEM_SHARED_DATA"
SHARED_DATA = Path("shared", "data")
SEARCH_DEPTH = 8  # parents of the working directory searched


def shared_data(*parts: str) -> Path:
    """``parts`` under the shared data folder.  Found relative to the working directory (``../shared/data/…``);
    where no folder is found the path is ``../shared/data/…``, so that the error of whoever opens it names it."""
    if os.environ.get(SHARED_ENV):
        return Path(os.environ[SHARED_ENV], *parts)
    for up in range(SEARCH_DEPTH):
        folder = Path(*[".."] * up, SHARED_DATA)
        if folder.is_dir():
            return folder.joinpath(*parts)
    return Path("..", SHARED_DATA, *parts)


def where_shared_data() -> str:
    """How ``shared_data`` found its folder, for error messages."""
    return (
        f"${SHARED_ENV}" if os.environ.get(SHARED_ENV) else f"searched for {SHARED_DATA} from the working directory up"
    )
