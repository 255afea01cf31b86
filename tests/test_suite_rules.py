"""The suite holds on a loaded machine: rules checked on the tests' own source, and the process
safety net shown at work.

- No Hypothesis test is bounded by the time one example takes (the suite's profile sets no
  deadline and suppresses the too_slow health check; a test's own settings keep both).
- A bound a test waits with (`timeout=`, `.wait(N)`) is below the test's pytest timeout, so the
  test's own wait fails with its own message, and its clean-up runs, before pytest-timeout
  interrupts it.
- A broker a test starts is gone after the test, whether it passed, failed or timed out; one a
  test forgets is killed at the end of the run, and fails the run.
"""

from __future__ import annotations

import ast
import functools
import operator
import os
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
from hypothesis import HealthCheck, settings

from sluiceway.testing import BrokerProcess
from tests.processes import describe, run_group

TESTS: Final = Path(__file__).resolve().parent
ROOT: Final = TESTS.parent
PYPROJECT: Final = tomllib.loads((ROOT / "pyproject.toml").read_text())
PYTEST_OPTIONS: Final = PYPROJECT["tool"]["pytest"]["ini_options"]
DEFAULT_TIMEOUT: Final = float(PYTEST_OPTIONS["timeout"])


def test_a_timeout_raises_in_the_test_so_its_clean_up_runs() -> None:
    assert PYTEST_OPTIONS["timeout_method"] == "signal"


@functools.cache
def sources() -> tuple[tuple[Path, ast.Module], ...]:
    """Every module of the suite, parsed once for all the rules."""
    return tuple(
        (path, ast.parse(path.read_text(), str(path))) for path in sorted(TESTS.rglob("*.py"))
    )


def keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def called(call: ast.Call) -> str:
    """The name a call is made by: `settings` for both `settings(...)` and `h.settings(...)`."""
    function = call.func
    if isinstance(function, ast.Attribute):
        return function.attr
    return function.id if isinstance(function, ast.Name) else ""


def test_the_suite_profile_has_no_deadline_and_allows_slow_data() -> None:
    profile = settings.default
    assert profile is not None
    assert profile.deadline is None
    assert HealthCheck.too_slow in profile.suppress_health_check


def test_no_hypothesis_settings_bring_back_a_deadline_or_the_too_slow_check() -> None:
    found: list[str] = []
    for path, tree in sources():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and called(node) == "settings"):
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            deadline = keyword(node, "deadline")
            if deadline is not None and not (
                isinstance(deadline, ast.Constant) and deadline.value is None
            ):
                found.append(f"{where}: a deadline ({ast.unparse(deadline)})")
            # A test's own list replaces the profile's: it must name too_slow again.
            checks = keyword(node, "suppress_health_check")
            if checks is not None and "too_slow" not in ast.unparse(checks):
                found.append(f"{where}: suppress_health_check without too_slow")
    assert found == []


@dataclass(frozen=True)
class Module:
    """What a test module says about time: its named numbers and its pytest timeout."""

    constants: dict[str, float]
    timeout: float

    @classmethod
    def read(cls, tree: ast.Module) -> Module:
        constants: dict[str, float] = {}
        timeout = DEFAULT_TIMEOUT
        for statement in tree.body:
            if isinstance(statement, ast.Assign | ast.AnnAssign) and statement.value is not None:
                targets = (
                    statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                )
                for target in targets:
                    if not isinstance(target, ast.Name):
                        continue
                    if target.id == "pytestmark":
                        timeout = mark_timeout(statement.value, constants) or timeout
                    value = number(statement.value, constants)
                    if value is not None:
                        constants[target.id] = value
        return cls(constants, timeout)


OPERATORS: Final = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
}


def number(node: ast.expr, constants: dict[str, float]) -> float | None:
    """The value of a number written as a literal, a module constant, or arithmetic of those;
    None when it depends on anything else."""
    if isinstance(node, ast.Constant):
        value = node.value
        return (
            float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
        )
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        left, right = number(node.left, constants), number(node.right, constants)
        if (
            left is None
            or right is None
            or (right == 0 and isinstance(node.op, ast.Div | ast.FloorDiv))
        ):
            return None
        return float(OPERATORS[type(node.op)](left, right))
    return None


def mark_timeout(node: ast.expr, constants: dict[str, float]) -> float | None:
    """N from `pytest.mark.timeout(N)`, alone or in a list of marks."""
    marks = node.elts if isinstance(node, ast.List | ast.Tuple) else [node]
    for mark in marks:
        if isinstance(mark, ast.Call) and ast.unparse(mark.func) == "pytest.mark.timeout":
            return number(mark.args[0], constants) if mark.args else None
    return None


def bounds(function: ast.FunctionDef, constants: dict[str, float]) -> Iterator[tuple[int, float]]:
    """(line, seconds) of each bound the function waits with, where it is a known number."""
    for node in ast.walk(function):
        if not isinstance(node, ast.Call):
            continue
        given = keyword(node, "timeout")
        if given is None and called(node) == "wait" and len(node.args) == 1:
            given = node.args[0]
        value = None if given is None else number(given, constants)
        if value is not None:
            yield node.lineno, value


def test_the_bounds_a_test_waits_with_add_up_to_less_than_its_pytest_timeout() -> None:
    # A sum, since a test's waits come one after another; a bound passed in a variable, or a
    # helper's default, is not seen here and is checked by reading. A helper of the module's
    # tests runs inside one of them: it is held to the longest timeout among them.
    found: list[str] = []
    for path, tree in sources():
        module = Module.read(tree)
        functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
        limits = {}
        for function in functions:
            limit = module.timeout
            for decorator in function.decorator_list:
                limit = mark_timeout(decorator, module.constants) or limit
            limits[function.name] = limit
        longest = max(
            (limit for name, limit in limits.items() if name.startswith("test")),
            default=module.timeout,
        )
        for function in functions:
            limit = limits[function.name]
            if not function.name.startswith("test"):
                limit = max(limit, longest)
            waits = list(bounds(function, module.constants))
            if waits and sum(seconds for _, seconds in waits) >= limit:
                lines = ", ".join(f"{seconds:g} s at line {line}" for line, seconds in waits)
                found.append(
                    f"{path.relative_to(ROOT)}::{function.name} waits up to {lines}, "
                    f"under a pytest timeout of {limit:g} s"
                )
    assert found == []


def test_every_program_a_test_runs_to_its_end_has_a_bound() -> None:
    # subprocess.run kills its program on any exception, the bound's included; a Popen is
    # waited for by communicate(timeout=...).
    found: list[str] = []
    for path, tree in sources():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            running = ast.unparse(node.func) == "subprocess.run" or node.func.attr == "communicate"
            if running and keyword(node, "timeout") is None:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)[:80]}")
    assert found == []


LEAKY: Final = """
    import os
    import subprocess
    import time
    from pathlib import Path

    import pytest

    from sluiceway.testing import BrokerProcess

    class Recorded(subprocess.Popen):
        # Writes down every process started, one whose start a timeout cut short included.
        def __init__(self, *args, **options):
            super().__init__(*args, **options)
            with Path(os.environ["STARTED_PIDS"]).open("a") as pids:
                pids.write(f"{self.pid}\\n")

    subprocess.Popen = Recorded

    def test_fails_with_a_broker_running():
        with BrokerProcess():
            raise AssertionError("fails on purpose")

    @pytest.mark.timeout(3)  # in the broker's start or in the sleep, as the load has it
    def test_times_out_with_a_broker_running():
        with BrokerProcess():
            time.sleep(30)

    def test_forgets_a_broker():
        BrokerProcess()
"""


@pytest.mark.timeout(150)
@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["in-process", "two-workers"])
def test_brokers_started_by_tests_are_gone_after_the_run(
    tmp_path: Path, workers: list[str]
) -> None:
    (tmp_path / "test_leaky.py").write_text(textwrap.dedent(LEAKY))
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\ntimeout = 60\nasyncio_default_fixture_loop_scope = function\n"
    )
    pids = tmp_path / "started"
    # The suite's conftest as a plugin: the run has the suite's safety net (in each worker
    # with pytest-xdist, which reports to the run what the net killed).
    result = run_group(
        [
            *(sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider"),
            *("-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path), str(tmp_path)),
            *workers,
        ],
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "STARTED_PIDS": str(pids)},
    )
    output = result.stdout + result.stderr
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, output
    assert "2 failed, 1 passed" in output, output
    assert "processes left running (now killed)" in output, output
    assert "first seen after test_leaky.py::test_forgets_a_broker" in output, output
    started = [int(pid) for pid in pids.read_text().split()]
    assert len(started) == 3, output
    left = [process for pid in started if (process := describe(pid)) is not None]
    assert [p for p in left if "sluiceway" in p.command] == []


def test_a_broker_that_does_not_get_ready_in_time_is_killed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spawned: list[subprocess.Popen[str]] = []
    popen = subprocess.Popen

    def recording(*args: Any, **options: Any) -> subprocess.Popen[str]:
        spawned.append(popen(*args, **options))
        return spawned[-1]

    monkeypatch.setattr(subprocess, "Popen", recording)
    with pytest.raises(RuntimeError, match=r"did not log its ready line within 0\.01 s"):
        BrokerProcess(timeout=0.01)
    assert len(spawned) == 1
    assert spawned[0].returncode is not None  # killed and waited for
