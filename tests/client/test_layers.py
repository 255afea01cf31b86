"""The modules of `sluiceway.client` import one another one way only.

Every import counts, also those under `if TYPE_CHECKING:`: a circle hidden from the interpreter
is still a circle for the reader. Imports inside functions are refused outright, since their
only use here was to dodge a circle (an optional dependency would be the one reason for one).
"""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path
from typing import Final

import sluiceway.client

PACKAGE: Final = "sluiceway.client"
SOURCES: Final = Path(sluiceway.client.__file__).parent


def modules() -> dict[str, ast.Module]:
    return {
        path.stem: ast.parse(path.read_text(encoding="utf-8"), str(path))
        for path in sorted(SOURCES.glob("*.py"))
    }


def imported(tree: ast.Module, known: set[str]) -> set[str]:
    """The modules of the package that `tree` imports, anywhere in it."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(
                alias.name.removeprefix(f"{PACKAGE}.")
                for alias in node.names
                if alias.name.startswith(f"{PACKAGE}.")
            )
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            if node.module == PACKAGE:  # `from sluiceway.client import sync`
                names.update(alias.name for alias in node.names if alias.name in known)
                names.add("__init__")
            elif node.module.startswith(f"{PACKAGE}."):
                names.add(node.module.removeprefix(f"{PACKAGE}."))
    return names


def test_the_client_modules_import_one_another_one_way() -> None:
    trees = modules()
    graph = {name: imported(tree, set(trees)) - {name} for name, tree in trees.items()}
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as exc:
        raise AssertionError(f"an import circle in {PACKAGE}: {exc.args[1]}") from None
    # The sans-IO protocol is at the bottom: it imports no other client module.
    assert graph["protocol"] == set()
    assert order.index("protocol") < order.index("wire") < order.index("link")


def test_no_module_of_the_client_imports_inside_a_function() -> None:
    inside = [
        f"{name}.py:{node.lineno}"
        for name, tree in modules().items()
        for function in ast.walk(tree)
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef)
        for node in ast.walk(function)
        if isinstance(node, ast.Import | ast.ImportFrom)
    ]
    assert inside == []
