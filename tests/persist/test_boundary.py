"""Core keeps no files: nothing under sluiceway.core imports the storage engine, the wiring, the
server, or a module that opens files, sockets or threads.

Persistence depends on core and never the reverse, so that a second store (a database) plugs
into the store port (core.model.store) without core changing, and core stays synchronous and
testable without a disk.
"""

from __future__ import annotations

import ast
from pathlib import Path

import sluiceway.core

CORE = Path(sluiceway.core.__file__).resolve().parent
# Packages of the project core must not reach into.
FORBIDDEN_PACKAGES = ("sluiceway.persist", "sluiceway.app", "sluiceway.server")
# Modules that open files, sockets or threads, or run an event loop.
FORBIDDEN_MODULES = frozenset(
    {
        "os",
        "io",
        "fcntl",
        "mmap",
        "shutil",
        "pathlib",
        "tempfile",
        "sqlite3",
        "socket",
        "asyncio",
        "threading",
    }
)


def _imports(tree: ast.Module) -> list[tuple[int, str]]:
    """Every module an import statement of `tree` names, with its line."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _forbidden(module: str) -> bool:
    if module.split(".", maxsplit=1)[0] in FORBIDDEN_MODULES:
        return True
    return any(module == p or module.startswith(p + ".") for p in FORBIDDEN_PACKAGES)


def test_core_imports_no_storage_and_no_file_io() -> None:
    sources = sorted(CORE.rglob("*.py"))
    assert sources, f"no modules found under {CORE}"
    offences = []
    for path in sources:
        tree = ast.parse(path.read_text(), filename=str(path))
        for line, module in _imports(tree):
            if _forbidden(module):
                offences.append(f"{path.relative_to(CORE.parent)}:{line} imports {module}")
    assert not offences, "core must not import these:\n" + "\n".join(sorted(set(offences)))


def test_the_check_sees_each_kind_of_import() -> None:
    tree = ast.parse(
        "import os.path\nfrom sluiceway.persist import journal\nfrom pathlib import Path\n"
        "from sluiceway.server.tls import x\nfrom sluiceway.core.values import message\n"
    )
    assert [m for _, m in _imports(tree) if _forbidden(m)] == [
        "os.path",
        "sluiceway.persist",
        "sluiceway.persist.journal",
        "pathlib",
        "pathlib.Path",
        "sluiceway.server.tls",
        "sluiceway.server.tls.x",
    ]
