"""The package's layers: the research tree (studies, baseline methods) sits beside the package, never inside it."""

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


def test_the_package_imports_nothing_from_the_research_tree():
    importers = {
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if any(name == "research" or name.startswith("research.") for name in imported_modules(path))
    }
    assert importers == set()
