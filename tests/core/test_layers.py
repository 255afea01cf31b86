"""The core's layers: every import points down, and no core modules import each other in a circle.

The layers, lowest first: values, containers, model, features, connection, broker. A module may
import from its own layer or a lower one, `if TYPE_CHECKING` imports included; within a layer
there is no circle. Below the core, values may use only sluiceway.errors, sluiceway.naming and
sluiceway.config.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import sluiceway.core

CORE: Final = Path(sluiceway.core.__file__).parent
LAYERS: Final = ("values", "containers", "model", "features", "connection", "broker")
BELOW_VALUES: Final = ("sluiceway.errors", "sluiceway.naming", "sluiceway.config")


def module_name(path: Path) -> str:
    parts = path.relative_to(CORE.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int:
    """The layer of core module `module` (the package itself counts as the top)."""
    parts = module.split(".")
    return LAYERS.index(parts[2]) if len(parts) > 2 else len(LAYERS) - 1


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(CORE.rglob("*.py"))}


def imports(path: Path, known: dict[str, Path]) -> Iterator[tuple[int, str]]:
    """(line, module) of every sluiceway import in `path`, wherever it stands in the file."""
    package = module_name(path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                # `from package import module` names the module itself.
                named = f"{base}.{alias.name}"
                yield node.lineno, named if named in known else base


def graph() -> dict[str, set[str]]:
    known = modules()
    return {
        module: {name for _, name in imports(path, known) if name in known and name != module}
        for module, path in known.items()
    }


def test_every_core_module_is_in_a_layer() -> None:
    for module in modules():
        parts = module.split(".")
        assert len(parts) == 2 or parts[2] in LAYERS, module


def test_imports_point_down() -> None:
    known = modules()
    upward = []
    for module, path in known.items():
        for line, name in imports(path, known):
            if name.startswith("sluiceway.core.") and name in known:
                if layer(name) > layer(module):
                    upward.append(f"{path.relative_to(CORE)}:{line} imports {name}")
            elif (
                name.startswith("sluiceway.")
                and layer(module) == 0
                and not name.startswith(BELOW_VALUES)
            ):
                upward.append(f"{path.relative_to(CORE)}:{line} imports {name}")
    assert not upward, "imports running upward:\n" + "\n".join(upward)


def test_no_circles() -> None:
    edges = graph()
    circles = [sorted(group) for group in strongly_connected(edges) if len(group) > 1]
    assert not circles, "core modules importing each other in a circle: " + "; ".join(
        " <-> ".join(group) for group in circles
    )


def strongly_connected(edges: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components of the import graph."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            groups.append(group)

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return groups


def test_the_check_sees_an_upward_import_and_a_circle() -> None:
    assert layer("sluiceway.core.features.producers") > layer("sluiceway.core.model.destination")
    circles = strongly_connected({"a": {"b"}, "b": {"a"}, "c": {"a"}})
    assert [sorted(group) for group in circles if len(group) > 1] == [["a", "b"]]
