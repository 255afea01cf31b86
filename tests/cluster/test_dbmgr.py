"""`sluiceway dbmgr` on a real PostgreSQL: the tables created, shown, upgraded and deleted from
the command line, the database named by -D or a properties file as for the broker, and clear
one-line errors with their exit status."""

from __future__ import annotations

import io
import re
from pathlib import Path

import psycopg
import pytest

from sluiceway.cli.main import main
from sluiceway.persist.schema import SCHEMA_VERSION
from sluiceway.testing.postgres import free_port

URL = "imq.persist.jdbc.postgresql.property.url"


def dbmgr(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["dbmgr", *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_create_show_and_delete_the_tables(
    pg_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    database = ("-D", f"{URL}={pg_url}")
    status, out, _ = dbmgr(capsys, "show", "version", *database)
    assert (status, "has no Sluiceway tables" in out) == (0, True)
    status, out, _ = dbmgr(capsys, "create", "tbl", *database)
    assert status == 0
    assert f"created the tables in {pg_url} (schema version {SCHEMA_VERSION})" in out
    status, out, _ = dbmgr(capsys, "create", "tbl", *database)
    assert (status, "are there already" in out) == (0, True)
    status, out, _ = dbmgr(capsys, "upgrade", "tbl", *database)
    assert (status, "are current" in out) == (0, True)
    status, out, _ = dbmgr(capsys, "show", "tbl", *database)
    assert status == 0
    assert f"schema version {SCHEMA_VERSION}" in out
    assert "sluiceway_chunk" in out
    assert re.search(r"sluiceway_schema +1 rows", out)

    monkeypatch.setattr("sys.stdin", io.StringIO("n\n"))
    status, out, err = dbmgr(capsys, "delete", "tbl", *database)
    assert status == 1
    assert "[y/N]" in out
    assert "not deleted" in err
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
    status, out, _ = dbmgr(capsys, "delete", "tbl", *database)
    assert (status, "deleted the tables" in out) == (0, True)
    status, out, _ = dbmgr(capsys, "delete", "tbl", "-f", *database)
    assert (status, "had no Sluiceway tables" in out) == (0, True)


def test_the_database_comes_from_the_brokers_properties_file(
    pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A cluster's shared file: the store and the cluster on, the broker id set per broker.
    properties = tmp_path / "cluster.properties"
    properties.write_text(f"imq.persist.store=jdbc\nimq.cluster.ha=true\n{URL}={pg_url}\n")
    status, out, err = dbmgr(capsys, "create", "tbl", "--config", str(properties))
    assert status == 0, err
    assert "created the tables" in out


def test_upgrade_refuses_an_empty_database_and_a_newer_schema_is_refused(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    database = ("-D", f"{URL}={pg_url}")
    status, _, err = dbmgr(capsys, "upgrade", "tbl", *database)
    assert status == 1
    assert "has no Sluiceway tables: create them with `sluiceway dbmgr create tbl`" in err
    assert dbmgr(capsys, "create", "tbl", *database)[0] == 0
    with psycopg.connect(pg_url, autocommit=True) as connection:
        connection.execute("UPDATE sluiceway_schema SET version = %s", (SCHEMA_VERSION + 1,))
    for verb in (("create", "tbl"), ("upgrade", "tbl"), ("delete", "tbl", "-f")):
        status, _, err = dbmgr(capsys, *verb, *database)
        assert status == 1
        assert f"schema version {SCHEMA_VERSION + 1}, newer than this broker's" in err
        assert err.count("\n") == 1


def test_an_unreachable_database_and_a_missing_url_are_one_line_each(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"postgresql://sluiceway:secret@127.0.0.1:{free_port()}/nowhere"
    status, _, err = dbmgr(capsys, "show", "tbl", "-D", f"{URL}={url}")
    assert status == 1
    assert err.startswith("sluiceway dbmgr: cannot reach the database")
    assert "secret" not in err
    assert err.count("\n") == 1
    status, _, err = dbmgr(capsys, "show", "tbl")
    assert status == 2
    assert URL in err
    status, _, err = dbmgr(capsys, "create", "version", "-D", f"{URL}={url}")
    assert status == 2
    assert "`create tbl`" in err


def test_the_schema_verbs_work_under_cmd_too(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    database = ("-D", f"{URL}={pg_url}")
    assert main(["cmd", "create", "tbl", *database]) == 0
    assert f"(schema version {SCHEMA_VERSION})" in capsys.readouterr().out
    assert main(["cmd", "show", "version", *database]) == 0
    assert f"schema version {SCHEMA_VERSION}" in capsys.readouterr().out
    assert main(["cmd", "upgrade", "tbl", *database]) == 0
    assert "are current" in capsys.readouterr().out
    assert main(["cmd", "delete", "tbl", "-f", *database]) == 0
    assert "deleted the tables" in capsys.readouterr().out
    # Other objects of the same verbs stay imqcmd's, which needs a broker.
    with pytest.raises(SystemExit):
        main(["cmd", "show", "dst"])
