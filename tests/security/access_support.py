"""What the tests of access changes and of the admin endpoint's rules share: the worked example
of docs/security.md read from the page itself, users files, raw clients with any credentials,
`sluiceway cmd` run as a process, and a rules file replaced the way an operator would."""

from __future__ import annotations

import functools
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from sluiceway.security.users import UserFile
from tests.admin.adminhttp import AdminHttp
from tests.cli.support import Result, run_cmd, run_on_terminal
from tests.e2e.rawclient import RawClient
from tests.e2e.support import wait_until
from tests.security.conftest import RULES, USERS, Secured

__all__ = ["RULES", "USERS", "run_cmd"]  # (for the hardening table, which imports this alone)

SECURITY_MD: Final = Path(__file__).resolve().parents[2] / "docs" / "security.md"
# The worked example's users (their groups are the page's; the passwords are the tests' own).
WORKED_USERS: Final = {
    "root": ("root-pw-Wx1", ("admin",)),
    "shop": ("shop-pw-Wx2", ("frontend",)),
    "intern": ("intern-pw-Wx3", ("frontend",)),
    "billing": ("billing-pw-Wx4", ("backend",)),
    "auditor": ("auditor-pw-Wx5", ("audit",)),
    "pricing": ("pricing-pw-Wx6", ()),
}
Users = dict[str, tuple[str, tuple[str, ...]]]


@dataclass(frozen=True)
class WorkedExample:
    """The section "A worked example" of docs/security.md, as written."""

    users_line: str  # "Users and groups: ...", on one line
    rules: str  # the properties block, verbatim
    rows: list[tuple[str, str, str]]  # the table: request, outcome, deciding rule
    create_command: str  # the `sluiceway cmd create dst ...` line it prescribes


@functools.cache
def worked_example() -> WorkedExample:
    text = SECURITY_MD.read_text()
    section = text.split("### A worked example", 1)[1].split("\n## ", 1)[0]
    paragraph = next(part for part in section.split("\n\n") if part.startswith("Users and"))
    users_line = " ".join(paragraph.split())
    rules = section.split("```properties\n", 1)[1].split("```", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 3:
            rows.append((cells[0], cells[1], cells[2]))
    command = section.split("```sh\n", 1)[1].split("```", 1)[0].strip()
    return WorkedExample(users_line, rules, rows, command)


@functools.cache
def _hashed(users: tuple[tuple[str, str, tuple[str, ...]], ...]) -> bytes:
    """A users file's bytes (scrypt is slow: each set of users is hashed once per run)."""
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "passwd"
        for name, password, groups in users:
            UserFile(path).add(name, password, groups)
        return path.read_bytes()


def write_users(path: Path, users: Users) -> Path:
    path.write_bytes(_hashed(tuple((name, pw, groups) for name, (pw, groups) in users.items())))
    return path


def worked_users(directory: Path) -> dict[str, str]:
    """The worked example's users file, made in `directory`: the property naming it."""
    path = write_users(directory / "worked-passwd", WORKED_USERS)
    return {"imq.user_repository.file.filename": str(path)}


def replace_file(path: Path, text: str) -> None:
    """Write `path` as an editor that saves by renaming does (never seen half-written)."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".edit-")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(temporary, path)


def client(secured: Secured, user: str, users: Users = USERS, **headers: str) -> RawClient:
    """A raw client connected as `user` (password from `users`), closed with the broker."""
    raw = secured.raw(connect=False)
    raw.connect(login=user, passcode=users[user][0], **headers)
    return raw


def cmd_as(secured: Secured, user: str, *args: str, users: Users = USERS) -> Result:
    """`sluiceway cmd ARGS -u USER -passfile FILE` against `secured`'s admin endpoint."""
    passfile = secured.directory / f"{user}.pass"
    passfile.write_text(users[user][0] + "\n")
    return run_cmd(
        *args, "-u", user, "-passfile", str(passfile), admin_port=secured.broker.admin_port
    )


def run_as_written(secured: Secured, line: str, users: Users = WORKED_USERS) -> Result:
    """A `sluiceway cmd ... -u USER -passfile FILE` line of the docs, run as it is written
    (its passfile made with USER's password) against `secured`'s admin endpoint."""
    words = line.split()
    assert words[:2] == ["sluiceway", "cmd"], line
    user = words[words.index("-u") + 1]
    at = words.index("-passfile") + 1
    passfile = secured.directory / "passfile"
    passfile.write_text(users[user][0] + "\n")
    words[at] = str(passfile)
    return run_cmd(*words[2:], admin_port=secured.broker.admin_port)


def cmd_on_terminal(secured: Secured, answer: str, *args: str) -> tuple[int, str, str]:
    """`sluiceway cmd ARGS` as root with a pseudo-terminal as its standard input, on which
    `answer` is typed: (exit status, stdout, stderr)."""
    passfile = secured.directory / "root.pass"
    passfile.write_text(USERS["root"][0] + "\n")
    where = ["-b", f"127.0.0.1:{secured.broker.admin_port}", "-u", "root", "-passfile"]
    return run_on_terminal([*args, *where, str(passfile)], answer)


def connection_id(secured: Secured, user: str) -> int:
    """The ID `sluiceway cmd list cxn` shows for `user`'s one connection (as root)."""
    result = cmd_as(secured, "root", "list", "cxn", "--json")
    assert result.status == 0, result.err
    ids = [row["id"] for row in result.json() if row["user"] == user]
    assert len(ids) == 1, result.out
    return int(ids[0])


def wait_refused(raw: RawClient, command: str, headers: dict[str, str]) -> dict[str, str]:
    """Repeat `command` (with a receipt, on a failed-receipts connection) until the broker
    refuses it: the barrier that says a rules change has been noticed. The failed RECEIPT."""
    seen: list[dict[str, str]] = []

    def refused() -> bool:
        # (each SUBSCRIBE its own id: the ones accepted before the change stay open)
        fields = {**headers, "id": f"probe-{len(seen)}"} if command == "SUBSCRIBE" else headers
        seen.append(raw.request(command, fields).headers)
        return "status" in seen[-1]

    wait_until(refused, timeout=10)
    return seen[-1]


def without_line(rules: str, line: str) -> str:
    assert line + "\n" in rules, line
    return rules.replace(line + "\n", "")


def closed_with(raw: RawClient) -> tuple[str, str, str, bool]:
    """The ERROR the broker sends on its own (the watcher acts within two looks, a second
    apart; the wait allows for a loaded machine), and whether the connection closed after it:
    status, message, body."""
    error = raw.expect("ERROR", timeout=15)
    raw.expect_closed()
    return error.headers["status"], error.headers["message"], error.body.decode(), raw.closed


def admin_status(port: int, user: str, users: Users = USERS, path: str = "/broker") -> int:
    """The HTTP status of GET /api/v1`path` with `user`'s credentials."""
    return AdminHttp(port, user, users[user][0]).call("GET", path)[0]
