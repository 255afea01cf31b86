"""The README's client examples run as written (against a broker on a free port)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from sluiceway.testing import BrokerThread

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
CLIENT_BLOCKS = [block for block in BLOCKS if "sluiceway.client" in block]


def test_the_readme_has_both_client_examples() -> None:
    assert any("import asyncio" in block for block in CLIENT_BLOCKS)
    assert any("sluiceway.client.sync" in block for block in CLIENT_BLOCKS)


@pytest.mark.parametrize("block", CLIENT_BLOCKS, ids=["asyncio", "sync"])
def test_readme_example_runs(block: str, broker: BrokerThread) -> None:
    code = block.replace("stomp://127.0.0.1:61613", f"stomp://127.0.0.1:{broker.port}")
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=45, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "received" in result.stdout
    assert "None" not in result.stdout  # a message really arrived
