"""`sluiceway cmd user add|delete|list`: the users file, without a broker."""

from __future__ import annotations

from pathlib import Path

from sluiceway.security.users import UserFile, verify_password
from tests.cli.support import run_cmd


def test_add_list_delete(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    where = ("--file", str(path))
    added = run_cmd("user", "add", "-u", "alice", "-p", "wonder", "-g", "admin", *where)
    assert added.status == 0, added.err
    assert added.out == f"Added user alice (groups: admin) to {path}.\n"
    assert run_cmd("user", "add", "-u", "bob", "-p", "builder", *where).status == 0

    users = UserFile(path).load()
    assert users["alice"].groups == ("admin",)
    assert users["bob"].groups == ("user",)  # imqusermgr's default group
    assert verify_password("wonder", users["alice"].password_hash)

    listed = run_cmd("user", "list", *where)
    assert listed.status == 0, listed.err
    assert "scrypt" not in listed.out  # never the hashes
    assert listed.out.splitlines()[1].split() == ["User", "Name", "Groups"]
    assert [line.split() for line in listed.out.splitlines()[3:]] == [
        ["alice", "admin"],
        ["bob", "user"],
    ]
    assert run_cmd("user", "list", "--json", *where).json() == [
        {"name": "alice", "groups": ["admin"]},
        {"name": "bob", "groups": ["user"]},
    ]

    deleted = run_cmd("user", "delete", "-u", "bob", *where)
    assert deleted.status == 0, deleted.err
    assert deleted.out == f"Deleted user bob from {path}.\n"
    assert list(UserFile(path).load()) == ["alice"]


def test_data_dir_and_password_on_standard_input(tmp_path: Path) -> None:
    result = run_cmd(
        "user", "add", "-u", "carol", "-g", "admin", "-g", "ops", "--data-dir", str(tmp_path),
        input_text="from-stdin\n",
    )  # fmt: skip
    assert result.status == 0, result.err
    user = UserFile(tmp_path / "passwd").load()["carol"]
    assert user.groups == ("admin", "ops")
    assert verify_password("from-stdin", user.password_hash)
    assert (tmp_path / "passwd").stat().st_mode & 0o077 == 0  # readable by its owner only


def test_config_names_the_file(tmp_path: Path) -> None:
    config = tmp_path / "broker.properties"
    path = tmp_path / "elsewhere" / "users"
    config.write_text(f"imq.user_repository.file.filename={path}\n")
    result = run_cmd("user", "add", "-u", "dave", "-p", "x", "--config", str(config))
    assert result.status == 0, result.err
    assert list(UserFile(path).load()) == ["dave"]


def test_refusals(tmp_path: Path) -> None:
    where = ("--file", str(tmp_path / "passwd"))
    assert run_cmd("user", "add", "-u", "erin", "-p", "one", *where).status == 0
    again = run_cmd("user", "add", "-u", "erin", "-p", "two", *where)
    assert again.status == 1
    assert "already exists" in again.error_line
    replaced = run_cmd("user", "add", "-u", "erin", "-p", "two", "--replace", *where)
    assert replaced.status == 0, replaced.err
    assert verify_password("two", UserFile(tmp_path / "passwd").load()["erin"].password_hash)

    missing = run_cmd("user", "delete", "-u", "nobody", *where)
    assert missing.status == 1
    assert "no user 'nobody'" in missing.error_line
    bad_name = run_cmd("user", "add", "-u", "no spaces", "-p", "x", *where)
    assert bad_name.status == 2
    assert "user name" in bad_name.error_line
    no_password = run_cmd("user", "add", "-u", "frank", *where)  # stdin: empty, not a terminal
    assert no_password.status == 2
    assert "no password" in no_password.error_line
    assert run_cmd("user", "list", "--file", str(tmp_path / "none")).out.startswith("No users")
