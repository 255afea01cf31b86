"""The compiled per-message path: built by the project's set-up, never run stale, and the Python
source in its place when asked for."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import sluiceway
import sluiceway.core.broker
import sluiceway.protocol.codec
import sluiceway.session.session
from sluiceway.compiled import MANIFEST, PACKAGE, PURE_VARIABLE, choose

from .test_compiled_rules import compiled_paths, module_of

ROOT = Path(__file__).resolve().parent.parent


def test_the_set_up_compiles_the_per_message_path() -> None:
    # ./dev installs with the compiled modules (it installs a C compiler when there is none).
    assert sluiceway.BUILD.compiled, sluiceway.BUILD.reason
    for module in (sluiceway.core.broker, sluiceway.protocol.codec, sluiceway.session.session):
        assert module.__file__ is not None
        assert module.__file__.endswith(".so"), module.__file__
    manifest = json.loads((PACKAGE / MANIFEST).read_text())
    assert sorted(manifest) == sorted(module_of(path) for path in compiled_paths())
    assert "sluiceway.core.model.store" not in manifest  # subclassed elsewhere: stays Python


def fake_package(tmp_path: Path, body: bytes = b"VALUE = 1\n") -> Path:
    package = tmp_path / "pkg"
    (package / "core").mkdir(parents=True)
    (package / "core" / "thing.py").write_bytes(body)
    manifest = {"pkg.core.thing": hashlib.sha256(b"VALUE = 1\n").hexdigest()}
    (package / MANIFEST).write_text(json.dumps(manifest))
    return package


def test_a_build_whose_sources_match_is_used(tmp_path: Path) -> None:
    build, modules = choose(fake_package(tmp_path), {})
    assert build.compiled
    assert not build.warn
    assert modules == ("pkg.core.thing",)


def test_a_source_changed_since_the_build_runs_as_source_with_a_warning(tmp_path: Path) -> None:
    build, modules = choose(fake_package(tmp_path, b"VALUE = 2\n"), {})
    assert not build.compiled
    assert build.warn
    assert "thing.py changed since it was compiled" in build.reason
    assert "./dev" in build.reason
    assert modules == ("pkg.core.thing",)  # these are imported from their source


def test_a_missing_source_counts_as_changed(tmp_path: Path) -> None:
    package = fake_package(tmp_path)
    (package / "core" / "thing.py").unlink()
    build, _ = choose(package, {})
    assert not build.compiled


def test_nothing_compiled_runs_as_source_with_a_warning(tmp_path: Path) -> None:
    build, modules = choose(tmp_path, {})
    assert not build.compiled
    assert build.warn
    assert "C compiler" in build.reason
    assert modules == ()


def test_asking_for_the_source_is_not_a_warning(tmp_path: Path) -> None:
    build, _ = choose(fake_package(tmp_path), {PURE_VARIABLE: "1"})
    assert not build.compiled
    assert not build.warn
    assert PURE_VARIABLE in build.reason


@pytest.mark.timeout(210)  # its two runs are bounded at 60 s and 120 s
def test_the_source_runs_the_broker_when_asked_for() -> None:
    # A process of its own: the choice is made once, at the first import. The session path
    # moves real messages through a broker and its journal.
    environment = dict(os.environ, **{PURE_VARIABLE: "1"})
    check = (
        "import sluiceway, sluiceway.core.broker as b, sluiceway.session.session as s;"
        "assert not sluiceway.BUILD.compiled;"
        "assert b.__file__.endswith('.py') and s.__file__.endswith('.py'), (b.__file__, s.__file__)"
    )
    subprocess.run([sys.executable, "-c", check], env=environment, check=True, timeout=60)
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "session_path.py"),
            "--scenario",
            "persistent",
            "--messages",
            "500",
        ],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "microseconds of CPU per message" in done.stdout
