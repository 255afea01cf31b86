"""The build: the broker's per-message path compiled to C with mypyc, where a C compiler is.

The modules in COMPILED stay plain Python too. Next to the compiled ones the build writes
`sluiceway/compiled.json`, the SHA-256 of each source as it was compiled; `sluiceway.compiled`
loads the compiled modules only when every source still matches (see that module). Without a C
compiler the install goes on without them and the broker runs as Python, at about half the
speed. `SLUICEWAY_COMPILE=0` skips compiling.

The project's metadata is in pyproject.toml; this file only adds the extension modules.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, CompileError, ExecError, LinkError, PlatformError

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "src"
# What every message goes through: decoding, the session, flow control, dispatch, the journal,
# encoding. Modules whose classes other code subclasses (core/store.py's MemoryStore) stay
# Python: a compiled class cannot be subclassed by Python code, nor have its methods replaced.
# So does naming.py: Spark pickles its frozen DestinationName, and a compiled frozen dataclass
# cannot be unpickled.
# Two things compile differently, and the compiled modules use neither: `raise ... from CAUSE`
# drops the cause (set __cause__ instead), and a memoryview slice evaluates a bound twice (no
# side effect in a slice bound). And generated code is not compiled: a dataclass's __init__ and
# a named tuple's __new__ run as interpreted Python, as does a member lookup on an enum of a
# module left out (`Kind.MEMBER` goes through EnumType.__getattr__). A class made per message
# writes its __init__ out, and such members are read through module Final names.
COMPILED = (
    "sluiceway/protocol/codec.py",
    "sluiceway/protocol/frames.py",
    *sorted(
        str(path.relative_to(SOURCES))
        for path in (SOURCES / "sluiceway" / "core").rglob("*.py")
        if path.name not in {"__init__.py", "store.py"}
    ),
    "sluiceway/session/headers.py",
    "sluiceway/session/render.py",
    "sluiceway/session/session.py",
    "sluiceway/persist/journal.py",
    "sluiceway/persist/recovering.py",
    "sluiceway/persist/segment_set.py",
    "sluiceway/persist/segments.py",
    *(
        f"sluiceway/persist/{name}.py"
        for name in (
            "journal_store",
            "format",
            "lease_payloads",
            "stage_payloads",
            "stage_extension",
            "lease_extension",
            "replay",
            "liveness",
            "restoring",
        )
    ),
)
MANIFEST = "compiled.json"
BUILD_FAILURES = (CCompilerError, CompileError, ExecError, LinkError, PlatformError, OSError)


def module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class CompileHotPath(build_ext):
    """Builds the compiled modules, or warns and leaves the package pure Python.

    mypyc analyses the modules when the build runs, not when setup.py is read: pip reads it
    several times (requirements, metadata, the build itself)."""

    def finalize_options(self) -> None:
        self.distribution.ext_modules = compiled_extensions()
        super().finalize_options()

    def run(self) -> None:
        try:
            super().run()
        except BUILD_FAILURES as exc:
            for output in self.get_outputs():
                Path(output).unlink(missing_ok=True)
            sys.stderr.write(
                f"warning: the compiled modules could not be built ({exc}); Sluiceway is "
                "installed as pure Python and runs about half as fast. Install a C compiler "
                "and the Python headers (apt-get install gcc python3-dev) and install again.\n"
            )
            return
        manifest = {module_name(path): digest(SOURCES / path) for path in COMPILED}
        package = Path(self.get_ext_fullpath("sluiceway.compiled")).parent  # where they went
        (package / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def compiled_extensions() -> list[Extension]:
    from mypyc.build import mypycify  # noqa: PLC0415 (a build requirement, not a dependency)

    # Module names come from the paths: src/ has no __init__.py, so src/sluiceway/x.py is
    # sluiceway.x. The C sources go to build/ (not kept).
    paths = [f"src/{path}" for path in COMPILED]
    return list(mypycify(paths, opt_level="3", group_name="sluiceway"))


# A stand-in until build_ext runs, so that the build knows there are extensions to build.
PLACEHOLDER = [] if os.environ.get("SLUICEWAY_COMPILE", "1") == "0" else [Extension("_", [])]
setup(ext_modules=PLACEHOLDER, cmdclass={"build_ext": CompileHotPath})
