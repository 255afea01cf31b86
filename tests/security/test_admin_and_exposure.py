"""The admin API's credentials, the loopback rule, and what a real broker process logs."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sluiceway.app.services import check_exposure
from sluiceway.config import build_config
from sluiceway.errors import ConfigError
from sluiceway.testing import BrokerProcess
from tests.e2e.rawclient import RawClient
from tests.security.conftest import PASSWORDS, RULES, USERS, Secured, SecuredFactory


def admin_get(port: int, path: str, user: str | None = None, password: str = "") -> int:
    """GET an admin API path (with HTTP Basic credentials when `user` is given): the status."""
    headers = {}
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    url = f"http://127.0.0.1:{port}{path}"
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310  (a local http URL)
            return int(response.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        return exc.code


# -- the admin API ----------------------------------------------------------------------------


def test_admin_api_needs_an_administrator(secured: Secured) -> None:
    port = secured.broker.admin_port
    assert admin_get(port, "/api/v1/broker") == 401
    assert admin_get(port, "/api/v1/broker", "root", "wrong") == 401
    assert admin_get(port, "/api/v1/broker", "nobody", "wrong") == 401
    assert admin_get(port, "/api/v1/broker", "bob", USERS["bob"][0]) == 403
    assert admin_get(port, "/api/v1/broker", "root", USERS["root"][0]) == 200


# -- the loopback rule ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("properties", "refused"),
    [
        pytest.param({"imq.hostname": "0.0.0.0"}, True, id="exposed"),  # noqa: S104  (the exposure the check refuses)
        pytest.param({"imq.hostname": "127.0.0.1"}, False, id="loopback"),
        pytest.param({"imq.hostname": "localhost"}, False, id="localhost"),
        pytest.param({"imq.hostname": "::1"}, False, id="ipv6-loopback"),
        pytest.param(
            {"imq.hostname": "0.0.0.0", "imq.authentication.insecure": "true"},  # noqa: S104  (the exposure the check refuses)
            False,
            id="insecure",
        ),
        pytest.param(
            {"imq.hostname": "0.0.0.0", "imq.authentication.enabled": "true"},  # noqa: S104  (the exposure the check refuses)
            False,
            id="authenticated",
        ),
    ],
)
def test_check_exposure(properties: dict[str, str], refused: bool) -> None:
    config = build_config(properties)
    if not refused:
        check_exposure(config)
        return
    with pytest.raises(ConfigError) as caught:
        check_exposure(config)
    assert caught.value.name == "imq.authentication.enabled"
    assert "imq.authentication.enabled=true" in str(caught.value)
    assert "imq.authentication.insecure=true" in str(caught.value)


def test_a_broker_on_every_address_without_authentication_will_not_start(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "sluiceway", "broker", "--host", "0.0.0.0", "--port", "0"]  # noqa: S104  (refused before binding)
    result = subprocess.run(
        [*command, "--data-dir", str(tmp_path), "-D", "imq.admin.http.port=0"],
        capture_output=True,
        text=True,
        timeout=45,  # below the test's 60 s: the run's own failure is the clearer one
        check=False,
    )
    assert result.returncode == 1
    assert "cannot start" in result.stderr
    assert "imq.authentication.enabled" in result.stderr
    assert "ready" not in result.stderr


def test_an_authenticating_broker_process_never_logs_a_password(
    tmp_path: Path, users_template: bytes
) -> None:
    users, access = tmp_path / "passwd", tmp_path / "acl.properties"
    users.write_bytes(users_template)
    access.write_text(RULES)
    typo = "typo-Vb5c"
    with BrokerProcess(
        "-D",
        "imq.authentication.enabled=true",
        "-D",
        f"imq.user_repository.file.filename={users}",
        "-D",
        f"imq.accesscontrol.file.filename={access}",
        "-D",
        "imq.log.level=DEBUG",
    ) as broker:
        for login, passcode in (("alice", typo), ("nobody", typo), ("carol", None)):
            client = RawClient(broker.port)
            headers = {"accept-version": "1.2", "host": "x", "login": login}
            if passcode is not None:
                headers["passcode"] = passcode
            client.send("CONNECT", headers)
            assert client.expect("ERROR").headers["status"] == "401"
            client.close()
        client = RawClient(broker.port)
        client.send_bytes(b"CONNECT\naccept-version:1.2\nlogin:bob\npasscode:\xfe\n\n\0")
        assert client.expect("ERROR").headers["status"] == "400"
        client.close()
        for user in ("alice", "carol", "eve"):
            client = RawClient(broker.port)
            client.send(
                "CONNECT", {"accept-version": "1.2", "login": user, "passcode": USERS[user][0]}
            )
            client.read_some(time.monotonic() + 5)
            client.close()
        carol = RawClient(broker.port)
        carol.connect(login="carol", passcode=USERS["carol"][0], failed_receipts="true")
        assert carol.request("SEND", {"destination": "/queue/orders"}).headers["status"] == "403"
        carol.close()
        assert admin_get(broker.admin_port, "/api/v1/broker", "root", USERS["root"][0]) == 200
        assert admin_get(broker.admin_port, "/api/v1/broker", "root", typo) == 401
        assert admin_get(broker.admin_port, "/api/v1/broker", "bob", USERS["bob"][0]) == 403
        code, log = broker.stop()
    assert code == 0
    assert "DEBUG" in log
    assert "wrong user name or password for user 'alice'" in log
    assert "user carol may not produce to /queue/orders" in log
    assert "user eve may not connect" in log
    for secret in (*PASSWORDS, typo):
        assert secret not in log


# -- connection.ADMIN rules, and files that cannot be read ------------------------------------


def test_a_connection_admin_deny_keeps_an_admin_group_member_out(
    secured_factory: SecuredFactory,
) -> None:
    rules = RULES.replace(
        "connection.ADMIN.allow.group=admin",
        "connection.ADMIN.allow.group=admin\nconnection.ADMIN.deny.user=root",
    )
    port = secured_factory(rules).broker.admin_port
    assert admin_get(port, "/api/v1/broker", "root", USERS["root"][0]) == 403


def _start_broker(tmp_path: Path, *properties: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "sluiceway", "broker", "--port", "0"]
    defines = [arg for prop in properties for arg in ("-D", prop)]
    return subprocess.run(
        [*command, "--data-dir", str(tmp_path), "-D", "imq.admin.http.port=-1", *defines],
        capture_output=True,
        text=True,
        timeout=45,  # below the test's 60 s: the run's own failure is the clearer one
        check=False,
    )


@pytest.mark.parametrize("broken", ["users", "rules"])
def test_a_broken_security_file_stops_the_start(
    tmp_path: Path, users_template: bytes, broken: str
) -> None:
    users, access = tmp_path / "passwd", tmp_path / "acl.properties"
    users.write_bytes(users_template)
    access.write_text(RULES)
    broken_file = users if broken == "users" else access
    with broken_file.open("a") as out:
        out.write("this line means nothing\n")
    result = _start_broker(
        tmp_path,
        "imq.authentication.enabled=true",
        f"imq.user_repository.file.filename={users}",
        f"imq.accesscontrol.file.filename={access}",
    )
    assert result.returncode == 1
    assert "cannot start" in result.stderr
    assert str(broken_file) in result.stderr
    assert "ready" not in result.stderr


def test_a_users_file_broken_while_running_answers_500(secured: Secured) -> None:
    port = secured.broker.admin_port
    assert admin_get(port, "/api/v1/broker", "root", USERS["root"][0]) == 200
    users = secured.directory / "passwd"
    users.write_bytes(users.read_bytes() + b"garbage without colons\n")
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/v1/broker",
        headers={"Authorization": "Basic " + base64.b64encode(b"root:x").decode()},
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)  # noqa: S310  (a local test URL)
    body = json.loads(caught.value.read())
    caught.value.close()
    assert caught.value.code == 500
    assert body["error"] == "cannot check credentials"
