"""How long the tests marked `soak` run: briefly in the suite, at length under `./dev soak`.

`./dev soak` sets SLUICEWAY_SOAK=1 and runs `pytest -m soak -s`; a soak test takes its
iteration count from `iterations(suite, soak)` and prints a paragraph of figures when it ends.
SLUICEWAY_SOAK=N (N > 1) asks for N iterations instead of the test's own soak count.
"""

from __future__ import annotations

import os
from typing import Final

SOAK_VARIABLE: Final = "SLUICEWAY_SOAK"


def soaking() -> bool:
    """Whether the tests run at length (SLUICEWAY_SOAK set to anything but 0 or nothing)."""
    return os.environ.get(SOAK_VARIABLE, "0").strip() not in ("", "0")


def iterations(suite: int, soak: int) -> int:
    """`suite` in the ordinary suite; `soak` under ./dev soak, or N with SLUICEWAY_SOAK=N."""
    if not soaking():
        return suite
    value = os.environ[SOAK_VARIABLE].strip()
    if not value.isdigit():
        raise ValueError(
            f"{SOAK_VARIABLE}={value!r}: expected 1 (each soak test's own count) or a number of "
            "iterations"
        )
    count = int(value)
    return soak if count == 1 else count
