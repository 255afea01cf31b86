"""The README's layout section names every package and top-level module of sluiceway."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "sluiceway"


def layout_names() -> set[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^  ([a-z_]+(?:/|\.py))", section, re.MULTILINE))


def test_every_package_and_module_is_in_the_layout() -> None:
    present = {f"{path.name}/" for path in PACKAGE.iterdir() if (path / "__init__.py").is_file()}
    present |= {
        path.name
        for path in PACKAGE.glob("*.py")
        if path.name not in {"__init__.py", "__main__.py"}
    }
    named = layout_names()
    assert present - named == set(), "README.md's Layout section does not name these"
    assert named - present == set(), "README.md's Layout section names what is not there"
