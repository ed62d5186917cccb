"""The package's layers: the paper's studies are a leaf that only ``tokmem bench`` reaches."""

import ast
from pathlib import Path

import tokmem

PACKAGE = Path(tokmem.__file__).parent


def imported_modules(path: Path) -> set[str]:
    """Every module a source file imports, at its top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def test_only_the_bench_command_imports_the_studies():
    importers = {
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if "studies" not in path.relative_to(PACKAGE).parts
        and any(name == "tokmem.studies" or name.startswith("tokmem.studies.") for name in imported_modules(path))
    }
    assert importers == {"cli/bench.py"}
