"""Which build of the per-message path runs: the compiled modules, or their Python source.

The build (setup.py) compiles the modules every message goes through with mypyc and writes
`compiled.json` beside this file: each compiled module's name and the SHA-256 of the source it
was compiled from. Python loads an extension module in preference to the source beside it, even
after the source changed, so this module decides once, when `sluiceway` is first imported:

- the compiled modules, when compiled.json is there and every source still has its hash;
- the Python source of all of them, when `SLUICEWAY_PURE_PYTHON` is set (a Python profiler sees
  only Python frames), when nothing was compiled (no C compiler at install), or when a source
  changed since the build: a stale build is never run. `./dev` rebuilds; so does
  `pip install -e .`.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Final

PURE_VARIABLE: Final = "SLUICEWAY_PURE_PYTHON"
MANIFEST: Final = "compiled.json"
PACKAGE: Final = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Build:
    """The build in use, and why: `reason` is one line for the broker's log."""

    compiled: bool
    reason: str
    warn: bool = False  # the user should act: the broker runs slower than it was built to


def source_of(root: Path, module: str) -> Path:
    return root / (module.replace(".", "/") + ".py")


def choose(package: Path, environ: Mapping[str, str]) -> tuple[Build, tuple[str, ...]]:
    """The build to use for the package at `package`, and the modules its build compiled."""
    try:
        manifest: dict[str, str] = json.loads((package / MANIFEST).read_text())
    except FileNotFoundError:
        reason = "Python source: nothing was compiled (install again with a C compiler)"
        return Build(compiled=False, reason=reason, warn=True), ()
    modules = tuple(manifest)
    if environ.get(PURE_VARIABLE):
        return Build(compiled=False, reason=f"Python source: {PURE_VARIABLE} is set"), modules
    for module, expected in manifest.items():
        source = source_of(package.parent, module)
        if not source.is_file() or hashlib.sha256(source.read_bytes()).hexdigest() != expected:
            reason = (
                f"Python source: {source} changed since it was compiled (rebuild with "
                "./dev or pip install -e .)"
            )
            return Build(compiled=False, reason=reason, warn=True), modules
    return Build(compiled=True, reason=f"compiled ({len(modules)} modules)"), modules


class _SourceFirst(importlib.abc.MetaPathFinder):
    """Finds the named modules' Python source, before the extension modules beside them."""

    def __init__(self, root: Path, modules: Iterable[str]) -> None:
        self._root = root
        self._modules = frozenset(modules)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self._modules:
            return None
        return importlib.util.spec_from_file_location(fullname, source_of(self._root, fullname))


def install(package: Path = PACKAGE, environ: Mapping[str, str] = os.environ) -> Build:
    """Decide, and when the source is to run, make imports find it first."""
    build, modules = choose(package, environ)
    if not build.compiled and modules:
        sys.meta_path.insert(0, _SourceFirst(package.parent, modules))
    return build


BUILD: Final = install()
