"""Running `sluiceway cmd` as a process, and looking at the broker through the admin API
directly (plain urllib, independent of the code under test)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

COMMAND_TIMEOUT = 30.0  # seconds for one `sluiceway cmd` run


@dataclass(frozen=True)
class Result:
    status: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    @property
    def error_line(self) -> str:
        """The one line a failure prints on stderr."""
        lines = self.err.splitlines()
        assert len(lines) == 1, self.err
        assert lines[0].startswith("sluiceway cmd: "), lines[0]
        return lines[0]


def run_cmd(
    *args: str,
    admin_port: int | None = None,
    stdin: int | None = subprocess.DEVNULL,
    input_text: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Result:
    """`python -m sluiceway cmd ARGS [-b 127.0.0.1:PORT]`; stdin is not a terminal unless given.

    The admin password variable of the test's own environment is removed, so only `env` sets it.
    """
    command = [sys.executable, "-m", "sluiceway", "cmd", *args]
    if admin_port is not None:
        command += ["-b", f"127.0.0.1:{admin_port}"]
    environment = {k: v for k, v in os.environ.items() if k != "SLUICEWAY_ADMIN_PASSWORD"}
    environment.update(env or {})
    completed = subprocess.run(
        command,
        stdin=None if input_text is not None else stdin,
        input=input_text,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        env=environment,
        check=False,
    )
    return Result(completed.returncode, completed.stdout, completed.stderr)


def run_on_terminal(args: list[str], answer: str) -> tuple[int, str, str]:
    """`python -m sluiceway cmd ARGS` with a pseudo-terminal as its standard input, on which
    `answer` is typed: (exit status, stdout, stderr). The command is killed if it outlives
    its bound, or the test's own timeout interrupts the wait."""
    main, secondary = os.openpty()
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "sluiceway", "cmd", *args],
            stdin=secondary,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        os.close(secondary)
        os.write(main, answer.encode() + b"\n")
        try:
            out, err = process.communicate(timeout=COMMAND_TIMEOUT)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate(timeout=5)  # killed: its pipes close at once
    finally:
        os.close(main)
    return process.returncode, out, err


def api(port: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """(HTTP status, JSON) of one admin API request, without credentials."""
    data = json.dumps(body if body is not None else {}).encode() if method != "GET" else None
    headers = {"Content-Type": "application/json"} if data is not None else {}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/v1{path}", data=data, headers=headers, method=method
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310  (http only)
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def get(port: int, path: str) -> Any:
    status, answer = api(port, "GET", path)
    assert status == 200, answer
    return answer


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0, what: str = "") -> None:
    """Poll `predicate` (every 20 ms) until it holds; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.02)


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def table_rows(output: str) -> list[list[str]]:
    """The data lines of a table (after the second rule), split on runs of spaces."""
    lines = output.splitlines()
    rules = [i for i, line in enumerate(lines) if line and set(line) == {"-"}]
    assert len(rules) >= 2, output
    return [line.split() for line in lines[rules[1] + 1 :] if line.strip()]


def pairs(output: str) -> dict[str, str]:
    """`query` output: name -> value (names and values separated by two or more spaces)."""
    found = {}
    for line in output.splitlines():
        name, sep, value = line.strip().partition("  ")
        if sep:
            found[name] = value.strip()
    return found
