"""One set of credential names, `username` and `password`, with `login` and `passcode` accepted
as their aliases in both client APIs and in the Spark connector's options."""

from __future__ import annotations

import pickle

import pytest

from sluiceway.client.pipeline import PipelineSettings
from sluiceway.client.settings import build_settings
from sluiceway.errors import ConfigError
from sluiceway.spark.options import source_options


def test_the_asyncio_client_takes_the_names_and_their_aliases() -> None:
    named = build_settings(username="etl", password="pw")  # noqa: S106  (a test password)
    assert named.username == "etl"
    aliased = build_settings(login="etl", passcode="pw")
    assert (aliased.username, aliased.password) == ("etl", "pw")
    same = build_settings(username="etl", login="etl")  # the same value twice: no conflict
    assert same.username == "etl"


def test_the_pipeline_client_takes_the_names_and_their_aliases() -> None:
    settings = PipelineSettings(username="etl", password="pw")  # noqa: S106  (a test password)
    aliased = PipelineSettings(login="etl", passcode="pw")
    assert aliased == settings
    # The aliases still read, for code written against the older names.
    assert (aliased.login, aliased.passcode) == ("etl", "pw")
    assert pickle.loads(pickle.dumps(aliased)) == settings  # noqa: S301  (bytes made just now)
    assert "pw" not in repr(settings)


def test_the_spark_options_take_the_names_and_their_aliases() -> None:
    for options in (
        {"username": "etl", "password": "pw"},
        {"login": "etl", "passcode": "pw"},
    ):
        connection = source_options({"destination": "/queue/q", **options}).connection
        assert (connection.username, connection.password) == ("etl", "pw")


def test_a_name_and_its_alias_with_different_values_are_refused_naming_both() -> None:
    with pytest.raises(ConfigError) as users:
        PipelineSettings(username="etl", login="other")
    assert users.value.name == "username"
    assert "username and login" in str(users.value)
    assert "'etl' and 'other'" in str(users.value)
    with pytest.raises(ConfigError) as passwords:
        build_settings(password="first-pw", passcode="second-pw")  # noqa: S106  (a test password)
    assert passwords.value.name == "password"
    assert "password and passcode" in str(passwords.value)
    # A password's values are never quoted.
    assert "first-pw" not in str(passwords.value)
    assert "second-pw" not in str(passwords.value)
    with pytest.raises(ConfigError, match="username and login"):
        source_options({"destination": "/queue/q", "username": "a", "login": "b"})
