"""`sluiceway cmd` against a broker with authentication on (users added with `sluiceway cmd
user add`), and against an admin endpoint served over HTTPS."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from sluiceway.testing import BrokerProcess
from tests.cli.support import run_cmd


@pytest.fixture(scope="module")
def passwd(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("users") / "passwd"
    for name, password, groups in (("root", "s3cret", ("admin",)), ("joe", "pw", ())):
        result = run_cmd(
            "user", "add", "-u", name, "-p", password, "--file", str(path),
            *(arg for group in groups for arg in ("-g", group)),
        )  # fmt: skip
        assert result.status == 0, result.err
    return path


@pytest.fixture(scope="module")
def secured(passwd: Path) -> Iterator[BrokerProcess]:
    with BrokerProcess(
        "-D", "imq.authentication.enabled=true",
        "-D", f"imq.user_repository.file.filename={passwd}",
    ) as process:  # fmt: skip
        yield process


def test_admin_with_passfile_in_open_mq_syntax(secured: BrokerProcess, tmp_path: Path) -> None:
    passfile = tmp_path / "passfile"
    passfile.write_text("# imqcmd password file\nimq.imqcmd.password=s3cret\n")
    result = run_cmd(
        "list", "dst", "-u", "root", "-passfile", str(passfile), admin_port=secured.admin_port
    )
    assert result.status == 0, result.err
    assert "mq.sys.dmq" in result.out


def test_admin_with_plain_passfile_and_environment(secured: BrokerProcess, tmp_path: Path) -> None:
    passfile = tmp_path / "plain"
    passfile.write_text("s3cret\n")
    port = secured.admin_port
    by_file = run_cmd("query", "bkr", "-u", "root", "-passfile", str(passfile), admin_port=port)
    assert by_file.status == 0, by_file.err
    by_env = run_cmd(
        "create", "dst", "-t", "q", "-n", "guarded", "-u", "root",
        admin_port=port, env={"SLUICEWAY_ADMIN_PASSWORD": "s3cret"},
    )  # fmt: skip
    assert by_env.status == 0, by_env.err


def test_user_not_in_admin_group_is_refused(secured: BrokerProcess) -> None:
    result = run_cmd(
        "pause", "dst", "-u", "joe", admin_port=secured.admin_port,
        env={"SLUICEWAY_ADMIN_PASSWORD": "pw"},
    )  # fmt: skip
    assert result.status == 1
    assert result.error_line.startswith("sluiceway cmd: not an administrator: user 'joe'")


def test_wrong_password_and_no_credentials_are_refused(secured: BrokerProcess) -> None:
    port = secured.admin_port
    wrong = run_cmd(
        "list", "dst", "-u", "root", admin_port=port, env={"SLUICEWAY_ADMIN_PASSWORD": "guess"}
    )
    assert wrong.status == 1
    assert "authentication required" in wrong.error_line
    assert "'root' was not accepted" in wrong.error_line
    anonymous = run_cmd("list", "dst", admin_port=port)
    assert anonymous.status == 1
    assert "-u" in anonymous.error_line  # says how to give credentials


def test_user_added_while_the_broker_runs(secured: BrokerProcess, passwd: Path) -> None:
    added = run_cmd("user", "add", "-u", "late", "-p", "pw2", "-g", "admin", "--file", str(passwd))
    assert added.status == 0, added.err
    result = run_cmd(
        "list", "cxn", "-u", "late", admin_port=secured.admin_port,
        env={"SLUICEWAY_ADMIN_PASSWORD": "pw2"},
    )  # fmt: skip
    assert result.status == 0, result.err
    assert result.out == "No connections.\n"


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def tls_broker(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    directory = tmp_path_factory.mktemp("tls")
    certificate = ca.issue_cert("127.0.0.1")
    certfile, keyfile = directory / "cert.pem", directory / "key.pem"
    certificate.private_key_pem.write_to_path(str(keyfile))
    certfile.write_bytes(b"".join(blob.bytes() for blob in certificate.cert_chain_pems))
    with BrokerProcess(
        "-D", "imq.admin.tls=true",
        "-D", f"imq.tls.certfile={certfile}",
        "-D", f"imq.tls.keyfile={keyfile}",
    ) as process:  # fmt: skip
        yield process


def test_tls(tls_broker: BrokerProcess, ca: trustme.CA, tmp_path: Path) -> None:
    cafile = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(cafile))
    port = tls_broker.admin_port
    result = run_cmd("list", "dst", "--tls", "--cafile", str(cafile), admin_port=port)
    assert result.status == 0, result.err
    assert "mq.sys.dmq" in result.out

    unverified = run_cmd("list", "dst", "--tls", admin_port=port)
    assert unverified.status == 3
    assert "certificate was not accepted" in unverified.error_line
    assert "--cafile" in unverified.error_line

    plain = run_cmd("list", "dst", admin_port=port)
    assert plain.status == 3
    assert "--tls" in plain.error_line
