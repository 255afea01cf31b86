"""The rules mypyc imposes on the compiled modules (docs/compiled.md), checked on their source.

The list of compiled modules is setup.py's COMPILED, read here without running setup.py. Each
rule is a function from a parsed module to the places that break it, so that a failure names
the file and the line; the tests at the end feed each rule a bad snippet, to show it can fail.
What cannot be read from the source (which modules run per message, which values are made per
message with generated code) is measured: the session path runs as Python source under a
profiler, in a process of its own.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "src"
PYTHON_TREES = ("src", "tests", "benchmarks", "examples")

# GCC keywords spelt with two leading underscores: mypyc names an attribute `_x` `__x` in C, so
# an attribute with one of these names, less one underscore, stops the C compile (checked with
# GCC 12 and mypyc 2.4.1).
C_KEYWORDS = frozenset(
    f"_{word}"
    for word in (
        "alignof",
        "asm",
        "const",
        "inline",
        "restrict",
        "signed",
        "thread",
        "typeof",
        "volatile",
    )
)
ENUM_BASES = frozenset({"Enum", "IntEnum", "StrEnum", "Flag", "IntFlag"})
# A module that runs this many calls per message or more, in one of the session path's
# scenarios, is on the per-message path. Those below it run once per read of 100 frames or
# less (the journal's file writes, the context's batch).
PER_MESSAGE = 0.25


@cache
def compiled_paths() -> tuple[str, ...]:
    """setup.py's COMPILED: paths relative to src/."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "COMPILED" for target in node.targets
        ):
            paths = ast.literal_eval(node.value)
            assert isinstance(paths, tuple)
            return tuple(str(path) for path in paths)
    raise AssertionError("setup.py has no COMPILED = (...) literal")


def module_of(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


@cache
def python_files() -> dict[str, Path]:
    """Every Python file of the project, by module name (tests.x, benchmarks.x, sluiceway.x)."""
    files = {}
    for tree in PYTHON_TREES:
        base = SOURCES if tree == "src" else ROOT
        for path in (ROOT / tree).rglob("*.py"):
            if ".venv" not in path.parts and "build" not in path.relative_to(ROOT).parts[:1]:
                files[module_of(str(path.relative_to(base)))] = path
    return files


@cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def compiled_modules() -> dict[str, Path]:
    return {module_of(path): SOURCES / path for path in compiled_paths()}


def imported_names(tree: ast.Module) -> dict[str, str]:
    """Local name -> the full name it was imported as (`from a.b import C` binds C to a.b.C)."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
    return names


def where(path: Path, node: ast.AST) -> str:
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    return f"{shown}:{getattr(node, 'lineno', 0)}"


# -- the rules ---------------------------------------------------------------------------------


def raise_from_a_cause(path: Path, tree: ast.Module) -> Iterator[str]:
    """`raise E from CAUSE`: compiled, the cause is dropped (E.__cause__ stays None). `from
    None` does nothing compiled either (the context stays, shown in a traceback), which loses
    nothing, so it is allowed."""
    for node in ast.walk(tree):
        cause = node.cause if isinstance(node, ast.Raise) else None
        if cause is not None and not (isinstance(cause, ast.Constant) and cause.value is None):
            yield (
                f"{where(path, node)}: `raise ... from {ast.unparse(cause)}` loses the cause "
                "once compiled: set the error's __cause__ and raise it"
            )


def memoryview_slice_effects(path: Path, tree: ast.Module) -> Iterator[str]:
    """A memoryview sliced with a call or an assignment in a bound: compiled, a memoryview
    slice evaluates its bounds twice."""
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        views = _memoryview_names(function)
        for node in ast.walk(function):
            if not (
                isinstance(node, ast.Subscript)
                and isinstance(node.slice, ast.Slice)
                and isinstance(node.value, ast.Name)
                and node.value.id in views
            ):
                continue
            bounds = (node.slice.lower, node.slice.upper, node.slice.step)
            if any(
                isinstance(inner, ast.Call | ast.NamedExpr | ast.Await | ast.Yield)
                for bound in bounds
                if bound is not None
                for inner in ast.walk(bound)
            ):
                yield (
                    f"{where(path, node)}: `{ast.unparse(node)}`: a memoryview slice's bounds "
                    "are evaluated twice once compiled; compute the bound into a name first"
                )


def _memoryview_names(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    def is_view(node: ast.expr | None) -> bool:
        return isinstance(node, ast.Call) and ast.unparse(node.func) == "memoryview"

    def annotated(node: ast.expr | None) -> bool:
        return node is not None and "memoryview" in ast.unparse(node)

    names = {
        arg.arg
        for arg in (*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs)
        if annotated(arg.annotation)
    }
    for node in ast.walk(function):
        if isinstance(node, ast.withitem) and is_view(node.context_expr):
            if isinstance(node.optional_vars, ast.Name):
                names.add(node.optional_vars.id)
        elif isinstance(node, ast.Assign) and is_view(node.value):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and (annotated(node.annotation) or is_view(node.value))
        ):
            names.add(node.target.id)
    return names


def c_keyword_attributes(path: Path, tree: ast.Module) -> Iterator[str]:
    """An attribute whose C name is a C keyword (`self._thread` is `__thread` in C)."""
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names = [node.attr]
        elif isinstance(node, ast.ClassDef):
            for statement in node.body:
                if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                    names.append(statement.target.id)
                elif isinstance(statement, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__slots__" for t in statement.targets
                ):
                    names += [
                        c.value
                        for c in ast.walk(statement.value)
                        if isinstance(c, ast.Constant) and isinstance(c.value, str)
                    ]
        for name in names:
            if name in C_KEYWORDS:
                yield (
                    f"{where(path, node)}: attribute {name!r} is the C keyword _{name} once "
                    "compiled (the C compile fails): rename it"
                )


def slots_read(path: Path, tree: ast.Module) -> Iterator[str]:
    """`x.__slots__` read: a compiled class has no __slots__ attribute at run time."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "__slots__"
            and isinstance(node.ctx, ast.Load)
        ):
            yield (
                f"{where(path, node)}: `{ast.unparse(node)}`: a compiled class has no __slots__ "
                "attribute (AttributeError once compiled): name the fields"
            )


def enum_members_of_python_modules(
    path: Path, tree: ast.Module, python_enums: frozenset[str], hot: frozenset[int]
) -> Iterator[str]:
    """`Kind.MEMBER` on a line that runs per message (`hot`: their numbers), for an enum of a
    module that is not compiled: each read goes through the enum's Python attribute lookup. A
    module-level Final name holding the member is a C static."""
    imported = imported_names(tree)
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            if (
                isinstance(node, ast.Attribute)
                and node.lineno in hot
                and isinstance(node.value, ast.Name)
                and imported.get(node.value.id) in python_enums
                and not node.attr.startswith("_")
                and node.attr.isupper()
            ):
                yield (
                    f"{where(path, node)}: `{ast.unparse(node)}` looks the member up in Python "
                    f"per message ({node.value.id} is not compiled): read it through a "
                    "module-level Final name"
                )


def subclasses_of(
    path: Path, tree: ast.Module, compiled_classes: Mapping[str, str]
) -> Iterator[str]:
    """A class in a module that is not compiled, subclassing a compiled class: made at run
    time, it fails with "interpreted classes cannot inherit from compiled"."""
    imported = imported_names(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        for base in node.bases:
            text = ast.unparse(base)
            head, _, rest = text.partition(".")
            full = imported.get(head, head) + (f".{rest}" if rest else "")
            if full in compiled_classes:
                yield (
                    f"{where(path, node)}: {node.name} subclasses {full}, which is compiled "
                    f"({compiled_classes[full]}): interpreted classes cannot inherit from "
                    "compiled ones; compile this module too, or do not subclass"
                )


# -- what the rules are checked against ---------------------------------------------------------


def enums_in(modules: Mapping[str, Path]) -> frozenset[str]:
    """The full names of the Enum classes defined in `modules`, and the names that re-export
    them (`from sluiceway.config.x import Kind` in sluiceway/config/__init__.py)."""
    enums = set()
    for module, path in modules.items():
        for node in parsed(path).body:
            if isinstance(node, ast.ClassDef) and any(
                ast.unparse(base).rpartition(".")[2] in ENUM_BASES for base in node.bases
            ):
                enums.add(f"{module}.{node.name}")
    for module, path in python_files().items():
        if module.startswith("sluiceway") and path.name == "__init__.py":
            for name, full in imported_names(parsed(path)).items():
                if full in enums:
                    enums.add(f"{module}.{name}")
    return frozenset(enums)


def violations() -> list[str]:
    compiled = compiled_modules()
    if len(compiled) < len(compiled_paths()):
        return []  # a module listed twice: the list is checked by its own test
    python = {
        module: path
        for module, path in python_files().items()
        if module not in compiled and module.startswith("sluiceway")
    }
    python_enums = enums_in(python)
    compiled_classes = {
        f"{module}.{node.name}": module
        for module, path in compiled.items()
        for node in parsed(path).body
        if isinstance(node, ast.ClassDef)
    }
    hot = session_path_profile()["lines"]
    assert isinstance(hot, dict)
    found: list[str] = []
    for relative, path in zip(compiled_paths(), compiled.values(), strict=True):
        tree = parsed(path)
        found += raise_from_a_cause(path, tree)
        found += memoryview_slice_effects(path, tree)
        found += c_keyword_attributes(path, tree)
        found += slots_read(path, tree)
        lines = frozenset(hot.get(relative, ()))
        found += enum_members_of_python_modules(path, tree, python_enums, lines)
    for module, path in python_files().items():
        if module not in compiled:
            found += subclasses_of(path, parsed(path), compiled_classes)
    return found


# -- the tests -----------------------------------------------------------------------------------


def test_every_compiled_module_exists() -> None:
    missing = [path for path in compiled_paths() if not (SOURCES / path).is_file()]
    assert not missing, (
        f"setup.py's COMPILED lists {', '.join(missing)}, which no longer exist: the per-message "
        "path moved; list the modules it is now in (docs/compiled.md, 'The compiled modules')"
    )


@pytest.mark.timeout(600)  # the session path traced: a minute on a busy machine
def test_the_compiled_modules_keep_the_rules() -> None:
    found = violations()
    assert not found, "the rules of docs/compiled.md are broken:\n" + "\n".join(found)


PROFILE = """
import collections, json, sys, tempfile
sys.path.insert(0, sys.argv[1])
import session_path
from sluiceway.app.storage import Storage
from sluiceway.config import load_config

MESSAGES = 500
PER_MESSAGE = float(sys.argv[2])
calls, lines, made = collections.Counter(), collections.Counter(), collections.Counter()

def trace(frame, event, arg):
    code = frame.f_code
    if "/sluiceway/" in code.co_filename:
        name = code.co_filename.rpartition("/src/")[2]
        calls[name] += 1
        def line(frame, event, arg):
            if event == "line":
                lines[name, frame.f_lineno] += 1
            return line
        return line
    if code.co_filename == "<string>" and code.co_name in ("__init__", "__new__"):
        made_by = frame.f_back.f_code.co_filename.rpartition("/src/")[2]
        value = frame.f_locals.get("self", frame.f_locals.get("_cls"))
        kind = value if isinstance(value, type) else type(value)
        made[made_by, frame.f_back.f_lineno, kind.__name__] += 1
    return None

per_message, hot, per_message_made = collections.Counter(), {}, set()
for scenario in ("queue", "persistent", "topic"):
    with tempfile.TemporaryDirectory() as directory:
        config = load_config(
            None, [f"imq.persist.file.directory={directory}", "imq.persist.file.sync.policy=os"]
        )
        storage = Storage(config)
        try:
            broker, _ = storage.open_broker()
            path = session_path.SessionPath(broker, scenario)
            path.run(MESSAGES)
            for counter in (calls, lines, made):
                counter.clear()
            sys.settrace(trace)
            path.run(MESSAGES)
            sys.settrace(None)
        finally:
            storage.close()
    for name, count in calls.items():
        per_message[name] = max(per_message[name], count / MESSAGES)
    for (name, line), count in lines.items():
        if count / MESSAGES >= PER_MESSAGE:
            hot.setdefault(name, set()).add(line)
    per_message_made.update(key for key, count in made.items() if count / MESSAGES >= PER_MESSAGE)
hot = {name: sorted(numbers) for name, numbers in hot.items()}
json.dump({"per_message": per_message, "lines": hot, "made": sorted(per_message_made)}, sys.stdout)
"""


@cache
def session_path_profile() -> dict[str, object]:
    """Calls per message of each module (the most of the three scenarios), the lines of each
    that run per message, and the places that make a value per message with generated code (a
    dataclass's __init__, a named tuple's __new__): the session path as Python source, traced."""
    environment = dict(os.environ, SLUICEWAY_PURE_PYTHON="1")
    done = subprocess.run(
        [sys.executable, "-c", PROFILE, str(ROOT / "benchmarks"), str(PER_MESSAGE)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=540,  # inside the 600 s of the tests that call it
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


@pytest.mark.timeout(600)  # the session path traced: a minute on a busy machine
def test_every_module_that_runs_per_message_is_compiled() -> None:
    per_message = session_path_profile()["per_message"]
    assert isinstance(per_message, dict)
    left_out = {
        path: round(count, 2)
        for path, count in per_message.items()
        if count >= PER_MESSAGE and path not in compiled_paths()
    }
    assert not left_out, (
        f"these modules run per message (calls per message) and are not in setup.py's "
        f"COMPILED: {left_out}"
    )


@pytest.mark.timeout(600)  # the session path traced: a minute on a busy machine
def test_nothing_per_message_is_made_by_generated_code() -> None:
    made = session_path_profile()["made"]
    assert isinstance(made, list)
    on_the_path = [
        f"src/{path}:{line}: makes a {kind} (a generated __init__ or __new__, interpreted "
        "Python once compiled): write its __init__ out, or make it a class"
        for path, line, kind in made
        if path in compiled_paths()
    ]
    assert not on_the_path, "\n".join(on_the_path)


# -- each rule can fail --------------------------------------------------------------------------


def check(rule: str, source: str, **known: object) -> list[str]:
    path = ROOT / "snippet.py"
    tree = ast.parse(source)
    rules = {
        "raise": lambda: raise_from_a_cause(path, tree),
        "memoryview": lambda: memoryview_slice_effects(path, tree),
        "keyword": lambda: c_keyword_attributes(path, tree),
        "slots": lambda: slots_read(path, tree),
        "enum": lambda: enum_members_of_python_modules(
            path,
            tree,
            known["enums"],  # type: ignore[arg-type]
            known["hot"],  # type: ignore[arg-type]
        ),
        "subclass": lambda: subclasses_of(path, tree, known["classes"]),  # type: ignore[arg-type]
    }
    return list(rules[rule]())


def test_a_raise_from_a_cause_is_found() -> None:
    source = """
def f() -> None:
    try:
        pass
    except OSError as error:
        raise ValueError("x") from error
    raise ValueError("y") from None
"""
    assert check("raise", source) == [
        "snippet.py:6: `raise ... from error` loses the cause once compiled: set the error's "
        "__cause__ and raise it"
    ]


@pytest.mark.parametrize(
    "source",
    [
        "def f(data: bytes) -> None:\n    with memoryview(data) as view:\n        view[g():]\n",
        "def f(data: bytes) -> None:\n    view = memoryview(data)\n    view[:(n := 2)]\n",
        "def f(view: memoryview) -> None:\n    view[1 : len(data)]\n",
    ],
)
def test_a_memoryview_slice_bound_with_an_effect_is_found(source: str) -> None:
    found = check("memoryview", source)
    assert len(found) == 1
    assert found[0].startswith("snippet.py:3:" if "view =" in source or "with" in source else "")


def test_a_plain_memoryview_slice_and_other_slices_pass() -> None:
    source = (
        "def f(data: bytes, n: int) -> None:\n"
        "    with memoryview(data) as view:\n"
        "        view[n : n + 4]\n"
        "    data[g():]\n"
    )
    assert check("memoryview", source) == []


def test_an_attribute_named_as_a_c_keyword_is_found() -> None:
    source = """
class Syncer:
    __slots__ = ("_inline",)

    def __init__(self) -> None:
        self._thread = None
        self._threads = 1
"""
    found = check("keyword", source)
    assert [line.split(":")[1] for line in found] == ["2", "6"]
    assert "'_inline'" in found[0]
    assert "'_thread'" in found[1]


def test_a_read_of_slots_is_found() -> None:
    source = """
class Value:
    __slots__ = ("a", "b")

    def __repr__(self) -> str:
        return ", ".join(getattr(self, name) for name in self.__slots__)
"""
    found = check("slots", source)
    assert len(found) == 1
    assert found[0].startswith("snippet.py:6: `self.__slots__`")


def test_an_enum_member_of_a_python_module_read_in_a_function_is_found() -> None:
    source = """
from typing import Final
from sluiceway.config import DispatchPolicy

_OPENMQ: Final = DispatchPolicy.OPENMQ

def f(policy: DispatchPolicy) -> bool:
    return policy is DispatchPolicy.FAIR or policy is _OPENMQ
"""
    enums = frozenset({"sluiceway.config.DispatchPolicy"})
    found = check("enum", source, enums=enums, hot=frozenset({8}))
    assert len(found) == 1
    assert found[0].startswith("snippet.py:8: `DispatchPolicy.FAIR`")
    assert check("enum", source, enums=enums, hot=frozenset()) == []  # not run per message


def test_a_python_subclass_of_a_compiled_class_is_found() -> None:
    source = """
import sluiceway.core.model.subscription as subscription
from sluiceway.core.containers.spilling import SpillingRun

class Run(SpillingRun):
    pass

class Other(subscription.Subscription):
    pass

class Fine(object):
    pass
"""
    classes = {
        "sluiceway.core.containers.spilling.SpillingRun": "sluiceway.core.containers.spilling",
        "sluiceway.core.model.subscription.Subscription": "sluiceway.core.model.subscription",
    }
    found = check("subclass", source, classes=classes)
    assert [line.split(":")[1] for line in found] == ["5", "8"]


def test_a_missing_module_in_the_list_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    listed = (*compiled_paths(), "sluiceway/core/moved_away.py")
    monkeypatch.setattr(sys.modules[__name__], "compiled_paths", lambda: listed)
    with pytest.raises(AssertionError, match=r"sluiceway/core/moved_away\.py, which no longer"):
        test_every_compiled_module_exists()
