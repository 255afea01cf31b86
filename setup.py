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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, CompileError, ExecError, LinkError, PlatformError

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "src"
# The per-message path, and nothing more: what every SEND, MESSAGE and ACK runs (decoding, the
# session, flow control and limits, dispatch, the journal's append, encoding), found by tracing
# benchmarks/session_path.py, and what it reads attributes of per message; and the modules
# that subclass one of its classes (Python classes cannot subclass compiled ones).
# tests/test_compiled_rules.py reads this tuple (keep it a literal), checks that each module
# exists, that whatever runs per message is listed, and the rules mypyc imposes on the source:
# docs/compiled.md says what they are and what they cost.
COMPILED = (
    "sluiceway/protocol/codec.py",
    "sluiceway/protocol/encoder.py",
    "sluiceway/protocol/frames.py",
    "sluiceway/protocol/message_frame.py",
    "sluiceway/session/access.py",
    "sluiceway/session/checks.py",
    "sluiceway/session/control.py",
    "sluiceway/session/headers.py",
    "sluiceway/session/render.py",
    "sluiceway/session/session.py",
    "sluiceway/core/broker.py",
    "sluiceway/core/connection.py",
    "sluiceway/core/features/durable_ports.py",
    "sluiceway/core/containers/pending.py",
    "sluiceway/core/containers/deadlines.py",  # subclasses PendingList
    "sluiceway/core/containers/spilling.py",
    "sluiceway/core/containers/seqlog.py",  # subclasses SpillingRun
    "sluiceway/core/features/leases.py",  # subclasses SpillingRun and BrowserSubscription
    "sluiceway/core/features/limits.py",
    "sluiceway/core/features/producers.py",
    "sluiceway/core/features/stages.py",  # subclasses SpillingRun
    "sluiceway/core/model/browsing.py",  # subclasses Subscription
    "sluiceway/core/model/context.py",  # read per message, as attributes (no calls to trace)
    "sluiceway/core/model/destination.py",
    "sluiceway/core/model/holding.py",
    "sluiceway/core/model/queue.py",
    "sluiceway/core/model/registry.py",
    "sluiceway/core/model/subscription.py",
    "sluiceway/core/model/topic.py",
    "sluiceway/core/values/clock.py",
    "sluiceway/core/values/flow.py",
    "sluiceway/core/values/fullness.py",
    "sluiceway/core/values/live_config.py",
    "sluiceway/core/values/memory.py",
    "sluiceway/core/values/message.py",
    "sluiceway/core/values/message_codec.py",
    "sluiceway/core/values/message_ids.py",
    "sluiceway/persist/format.py",
    "sluiceway/persist/journal.py",
    "sluiceway/persist/journal_store.py",
    "sluiceway/persist/liveness.py",
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

    def build_extension(self, ext: Extension) -> None:
        """Compile the extension's C files at once, one per CPU: the group's library has one
        file per module and mypyc's runtime, which setuptools would compile one by one."""
        compile_one = self.compiler.compile

        def compile_all(sources: list[str], *args: Any, **kwargs: Any) -> list[str]:
            with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
                done = pool.map(lambda source: compile_one([source], *args, **kwargs), sources)
                return [obj for objects in done for obj in objects]

        self.compiler.compile = compile_all
        try:
            super().build_extension(ext)
        finally:
            del self.compiler.compile

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
    # One group (one shared library): mypyc's whole-program optimisations need it (in separate
    # groups every method call is virtual); one C file per module (multi_file), so that they
    # compile in parallel.
    return list(mypycify(paths, opt_level="3", multi_file=True, group_name="sluiceway"))


# A stand-in until build_ext runs, so that the build knows there are extensions to build.
PLACEHOLDER = [] if os.environ.get("SLUICEWAY_COMPILE", "1") == "0" else [Extension("_", [])]
setup(ext_modules=PLACEHOLDER, cmdclass={"build_ext": CompileHotPath})
