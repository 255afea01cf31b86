"""Credentials kept out of the pipeline client's settings: a password file readable by its owner
only, environment variables, one source per credential, read each time a connection is made."""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from sluiceway.client.credentials import one_source, read_environment, read_password_file
from sluiceway.client.pipeline import PipelineConnection, PipelineSettings
from sluiceway.errors import ConfigError, Unauthorized
from sluiceway.security.users import UserFile
from sluiceway.testing import BrokerThread

USER: Final = "etl"
PASSWORD: Final = "etl-secret"  # noqa: S105  (a test password)
VARIABLE: Final = "SLUICEWAY_TEST_PASSWORD"


@pytest.fixture
def password_file(tmp_path: Path) -> Path:
    path = tmp_path / "password"
    path.write_text(f"{PASSWORD}\nnot read\n")
    os.chmod(path, 0o600)
    return path


def test_a_password_file_gives_its_first_line_when_its_owner_alone_may_read_it(
    password_file: Path,
) -> None:
    assert read_password_file(str(password_file), "passwordFile") == PASSWORD
    os.chmod(password_file, 0o640)
    with pytest.raises(ConfigError) as shared:
        read_password_file(str(password_file), "passwordFile")
    assert shared.value.name == "passwordFile"
    assert f"chmod 600 {password_file}" in str(shared.value)
    assert "mode 640" in str(shared.value)
    with pytest.raises(ConfigError, match=r"cannot read the password file .*No such file"):
        read_password_file(str(password_file.with_name("missing")), "passwordFile")


def test_an_environment_variable_must_be_set_and_hold_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(VARIABLE, raising=False)
    with pytest.raises(ConfigError, match=f"{VARIABLE} .*is not set") as unset:
        read_environment(VARIABLE, "passwordEnv")
    assert unset.value.name == "passwordEnv"
    assert f"spark.executorEnv.{VARIABLE}" in str(unset.value)
    monkeypatch.setenv(VARIABLE, "two\nlines")
    with pytest.raises(ConfigError, match="line end"):
        read_environment(VARIABLE, "passwordEnv")
    monkeypatch.setenv(VARIABLE, PASSWORD)
    assert read_environment(VARIABLE, "passwordEnv") == PASSWORD


def test_a_credential_comes_from_one_source() -> None:
    one_source({"password": None, "passwordFile": "f", "passwordEnv": None})
    with pytest.raises(ConfigError, match="password and password_file were given together"):
        PipelineSettings(password="pw", password_file="f")  # noqa: S106  (a test password)
    with pytest.raises(ConfigError, match="password_env and password_file"):
        PipelineSettings(password_env=VARIABLE, password_file="f")  # noqa: S106  (a file's name)
    with pytest.raises(ConfigError, match="username and username_env") as users:
        PipelineSettings(login=USER, username_env="USER")
    assert users.value.name == "username"


def test_the_settings_hold_where_the_password_is_never_the_password(
    password_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(VARIABLE, PASSWORD)
    for settings in (
        PipelineSettings(username=USER, password_file=str(password_file)),
        PipelineSettings(username=USER, password_env=VARIABLE),
    ):
        assert settings.credentials() == (USER, PASSWORD)
        shipped = pickle.dumps(PipelineConnection(settings))
        assert PASSWORD.encode() not in shipped
        assert PASSWORD not in repr(settings)
    assert f"password_file={str(password_file)!r}" in repr(
        PipelineSettings(password_file=str(password_file))
    )


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[BrokerThread]:
    users = tmp_path / "passwd"
    UserFile(users).add(USER, PASSWORD, ())
    properties = {
        "imq.authentication.enabled": "true",
        "imq.user_repository.file.filename": str(users),
    }
    with BrokerThread(properties) as broker:
        yield broker


def test_the_credentials_are_read_again_at_every_connect(
    secured: BrokerThread, password_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICEWAY_TEST_USER", USER)
    monkeypatch.setenv(VARIABLE, PASSWORD)
    from_environment = PipelineSettings(
        port=secured.port, username_env="SLUICEWAY_TEST_USER", password_env=VARIABLE, timeout=5.0
    )
    with PipelineConnection(from_environment) as connection:
        assert connection.head("/queue/q").message_count == 0
        connection.close()
        monkeypatch.setenv(VARIABLE, "changed")
        with pytest.raises(Unauthorized, match=f"user '{USER}'"):
            connection.connect()

    from_file = PipelineSettings(
        port=secured.port, username=USER, password_file=str(password_file), timeout=5.0
    )
    with PipelineConnection(from_file) as connection:
        assert connection.head("/queue/q").message_count == 0
    os.chmod(password_file, 0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        PipelineConnection(from_file).connect()
