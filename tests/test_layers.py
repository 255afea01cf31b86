"""The packages of sluiceway import one way: down the table below, never up, and never in a circle.

Every import in src/sluiceway is read with `ast` (those under TYPE_CHECKING and inside functions
included: a type-only arrow still ties the packages together). A package is a directory under
src/sluiceway, or a module at its top; `sluiceway` itself is the package's __init__.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import sluiceway

SOURCE: Final = Path(sluiceway.__file__).parent

# Lowest first: a package may import those above it in this table, never those below.
LAYERS: Final[tuple[tuple[str, str], ...]] = (
    ("compiled", "which modules the build compiled; read by the package's __init__"),
    ("sluiceway", "the package's __init__: __version__ and the build, imported everywhere"),
    ("errors", "the one exception tree; imports nothing of the project"),
    ("naming", "destination names and their rules; needs nothing else"),
    ("javaprops", "the Java properties file format, for config and the client's settings"),
    ("config", "the broker's frozen configuration, built from properties"),
    ("collector", "the cycle collector's tuning, for the broker and the load generators"),
    ("protocol", "the STOMP codec and frames: bytes in, frames out, nothing of the broker"),
    ("client", "a STOMP client on the codec alone: it never reaches into the broker"),
    ("spark", "the Spark connector, built on the client"),
    ("core", "the broker's synchronous state machine"),
    ("persist", "the journal and the records the core's state is stored as"),
    # Below session, not above it as first planned: the session authenticates and checks
    # access with security's Gate, and security needs nothing above config.
    ("security", "users, logins and access rules; the session and admin check them"),
    # Below session and server: the server is handed the cluster's fence; links between members
    # speak STOMP through the client and reach the local broker through the core.
    ("cluster", "membership, leases and fencing, takeover and links between brokers"),
    ("session", "the sans-IO STOMP session: frames to core commands, effects to frames"),
    ("server", "the asyncio shell: moves bytes between sockets and sessions"),
    ("admin", "the HTTP API, console and /metrics, reading a narrow view of what runs"),
    ("app", "the wiring: builds the storage, broker, listeners and admin, and the tick"),
    ("testing", "a broker in a thread for tests, wired as app wires it"),
    ("analysis", "reads benchmark results; names the core's flow limits in its rules"),
    ("bench", "the benchmark's workers and streams, on the codec only"),
    ("loadgen", "producers and consumers for benchmarks, on bench's streams"),
    ("cli", "the command line: starts app, runs admin commands, benchmarks, analysis"),
    ("__main__", "python -m sluiceway: the command line"),
)
RANK: Final = {name: rank for rank, (name, _) in enumerate(LAYERS)}

# Arrows that still run up, importer package -> imported package, each with why it remains.
KNOWN_UP: Final[dict[tuple[str, str], str]] = {}
# Circles between packages that the arrows above make, as the set of packages in each.
KNOWN_CIRCLES: Final[tuple[frozenset[str], ...]] = ()


@dataclass(frozen=True, slots=True)
class Arrow:
    """One import of one package by another."""

    source: str  # the importing package
    target: str  # the imported package
    where: str  # the importing file and line
    imported: str  # the module named by the import

    def __str__(self) -> str:
        return f"{self.where}: {self.source} imports {self.imported}"


def package_of(relative: Path) -> str:
    if len(relative.parts) > 1:
        return relative.parts[0]
    return "sluiceway" if relative.stem == "__init__" else relative.stem


def module_of(relative: Path) -> list[str]:
    parts = ["sluiceway", *relative.with_suffix("").parts]
    return parts[:-1] if parts[-1] == "__init__" else parts


def is_module(parts: list[str]) -> bool:
    path = SOURCE.joinpath(*parts[1:])
    return path.is_dir() or path.with_suffix(".py").is_file()


def imported_modules(relative: Path, node: ast.AST) -> Iterator[list[str]]:
    """The sluiceway modules `node` imports, each as its dotted parts."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name.split(".")
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            base = module_of(relative)
            if relative.stem != "__init__":
                base = base[:-1]
            base = base[: len(base) - node.level + 1]
        else:
            base = []
        parts = base + (node.module.split(".") if node.module else [])
        for alias in node.names:
            # `from sluiceway import admin` imports a package; `import __version__` does not.
            named = [*parts, alias.name]
            yield named if is_module(named) else parts


@functools.cache
def arrows() -> tuple[Arrow, ...]:
    return tuple(read_arrows())


def read_arrows() -> Iterator[Arrow]:
    for path in sorted(SOURCE.rglob("*.py")):
        relative = path.relative_to(SOURCE)
        source = package_of(relative)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for parts in imported_modules(relative, node):
                if parts[0] != "sluiceway":
                    continue
                target = parts[1] if len(parts) > 1 else "sluiceway"
                if target != source:
                    where = f"src/sluiceway/{relative}:{getattr(node, 'lineno', 0)}"
                    yield Arrow(source, target, where, ".".join(parts))


def circles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected groups of more than one package (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for after in sorted(edges.get(node, ())):
            if after not in index:
                visit(after)
                low[node] = min(low[node], low[after])
            elif after in stack:
                low[node] = min(low[node], index[after])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(frozenset(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_every_package_has_its_place_in_the_table() -> None:
    packages = {package_of(path.relative_to(SOURCE)) for path in SOURCE.rglob("*.py")}
    assert sorted(packages - RANK.keys()) == [], "add these packages to LAYERS, with a reason"
    assert sorted(RANK.keys() - packages) == [], "these packages in LAYERS no longer exist"


def test_no_import_runs_up_the_layers() -> None:
    found = list(arrows())
    up = [
        arrow
        for arrow in found
        if RANK[arrow.target] > RANK[arrow.source] and (arrow.source, arrow.target) not in KNOWN_UP
    ]
    assert [str(arrow) for arrow in up] == [], "imports that run up the layers (see LAYERS)"
    still_up = {(arrow.source, arrow.target) for arrow in found}
    stale = sorted(pair for pair in KNOWN_UP if pair not in still_up)
    assert stale == [], "these arrows no longer run up: remove them from KNOWN_UP"


def test_no_import_circle_between_packages() -> None:
    edges: dict[str, set[str]] = {}
    witnesses: dict[tuple[str, str], Arrow] = {}
    for arrow in arrows():
        edges.setdefault(arrow.source, set()).add(arrow.target)
        witnesses.setdefault((arrow.source, arrow.target), arrow)
    found = circles(edges)
    unknown = [
        sorted(
            str(witness)
            for (source, target), witness in witnesses.items()
            if source in group and target in group
        )
        for group in found
        if group not in KNOWN_CIRCLES
    ]
    assert unknown == [], "import circles between packages, one import of each arrow shown"
    stale = [sorted(group) for group in KNOWN_CIRCLES if group not in found]
    assert stale == [], "these circles are gone: remove them from KNOWN_CIRCLES"


def test_the_circle_finder_finds_a_circle_and_only_that() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(edges) == [frozenset({"a", "b", "c"})]


def test_no_import_circle_between_modules() -> None:
    # Within a package too: a circle between two modules of one package is the same knot
    # at a smaller scale (type-only imports included, as above).
    edges: dict[str, set[str]] = {}
    for path in sorted(SOURCE.rglob("*.py")):
        relative = path.relative_to(SOURCE)
        source = ".".join(module_of(relative))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for parts in imported_modules(relative, node):
                target = ".".join(parts)
                if parts[0] == "sluiceway" and is_module(parts) and target != source:
                    edges.setdefault(source, set()).add(target)
    # A package's __init__ importing its own modules is how a package shows its face, not a
    # circle, when those modules import the package's other modules by their full names.
    for source, targets in edges.items():
        edges[source] = {t for t in targets if not source.startswith(t + ".")}
    assert [sorted(group) for group in circles(edges)] == []
