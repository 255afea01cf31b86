"""The progress line: drawn in place, only when it changes, and wiped at the end."""

from __future__ import annotations

import io

from sluiceway.bench.command import ProgressBar


def test_the_bar_redraws_only_on_change_and_wipes_itself() -> None:
    out = io.StringIO()
    bar = ProgressBar(out)
    bar.update(10, 5, 10)
    bar.update(10, 5, 10)
    bar.update(10, 10, 10)
    text = out.getvalue()
    assert text.count("\r") == 2
    assert "[" + "#" * 15 + "." * 15 + "] sent 10 received 5" in text
    assert "#" * 30 in text
    bar.close()
    assert out.getvalue().endswith("\r")
