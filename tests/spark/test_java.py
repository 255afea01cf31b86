"""Without Java the Spark tests skip, and the reason names what to install."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.spark.conftest import java_problem


def test_a_missing_java_is_named_as_the_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # a directory with no java in it
    problem = java_problem()
    assert problem is not None
    assert "Java" in problem
    assert "openjdk-17-jre-headless" in problem


def test_a_broken_java_is_named_as_the_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text("#!/bin/sh\necho 'no runtime here' >&2\nexit 3\n")
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    problem = java_problem()
    assert problem is not None
    assert "no runtime here" in problem
