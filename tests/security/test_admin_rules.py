"""Who administers: the warnings a rules file gets when it lets nobody, or everybody, use the
admin endpoint, and what a refused administrator sees and the broker logs."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from sluiceway.security.access import DEFAULT_RULES, AccessControl
from tests.admin.adminhttp import AdminHttp
from tests.e2e.support import wait_until
from tests.security.conftest import RULES, USERS, Secured, SecuredFactory

NORMAL = "connection.NORMAL.allow.user=*\n"


@pytest.mark.parametrize(
    ("rules", "warning"),
    [
        pytest.param(DEFAULT_RULES, None, id="default-rules"),
        pytest.param(RULES, None, id="suite-rules"),
        pytest.param(
            NORMAL,
            "allows anyone to administer the broker, so the admin endpoint refuses every request; "
            "add connection.ADMIN.allow.group=admin",
            id="no-admin-rule",
        ),
        pytest.param(
            NORMAL + "connection.ADMIN.deny.user=root\n",
            "allows anyone to administer the broker",
            id="only-a-deny",
        ),
        pytest.param(
            "connection.*.allow.user=*\n",
            "connection.*.allow.user=* (line 1 of {path}) lets every user administer the broker; "
            "a connection.* rule covers the admin endpoint too",
            id="connection-star",
        ),
        pytest.param(
            NORMAL + "connection.ADMIN.allow.group=*\n",
            "connection.ADMIN.allow.group=* (line 2 of {path}) lets every user administer",
            id="any-group",
        ),
        pytest.param(
            "connection.*.allow.user=*\nconnection.ADMIN.deny.user=*\n"
            "connection.ADMIN.allow.group=admin\n",
            None,
            id="star-narrowed-for-admin",
        ),
    ],
)
def test_warnings_about_who_administers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, rules: str, warning: str | None
) -> None:
    path = tmp_path / "accesscontrol.properties"
    path.write_text(rules)
    access = AccessControl(path)
    assert access.problem is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if warning is None:
        assert warnings == []
    else:
        (logged,) = warnings
        assert warning.format(path=path) in logged


def test_a_refused_administrator_is_told_how_to_be_allowed(
    secured: Secured, caplog: pytest.LogCaptureFixture
) -> None:
    status, answer = AdminHttp(secured.broker.admin_port, "bob", USERS["bob"][0]).call(
        "GET", "/broker"
    )
    assert (status, answer["error"]) == (403, "not an administrator")
    assert answer["detail"] == (
        "user 'bob' may not administer the broker: the broker's access rules do not allow it; "
        "an administrator can allow it in the access control file "
        "(imq.accesscontrol.file.filename), e.g. with connection.ADMIN.allow.user=bob"
    )
    assert (
        "admin request GET /api/v1/broker by 'bob' refused: not an administrator: no rule of "
        f"{secured.access_file} allows it"
    ) in caplog.text


def test_an_invalid_rules_file_refuses_every_administrator(secured: Secured) -> None:
    secured.access_file.write_text(RULES + "connection.ADMIN.allow.usr=root\n")
    api = AdminHttp(secured.broker.admin_port, "root", USERS["root"][0])
    # (the file is looked at at most once a second: the first answers may predate the edit)
    answers: list[tuple[int, dict[str, object]]] = []

    def refused() -> bool:
        answers.append(api.call("GET", "/broker"))
        return answers[-1][0] == 403

    wait_until(refused, timeout=10)
    assert answers[-1][1]["detail"] == (
        "user 'root' may not administer the broker: the broker's access rules cannot be read; "
        "an administrator must fix them"
    )


def test_without_access_control_the_admin_group_decides(secured_factory: SecuredFactory) -> None:
    secured = secured_factory(RULES, **{"imq.accesscontrol.enabled": "false"})
    status, answer = AdminHttp(secured.broker.admin_port, "carol", USERS["carol"][0]).call(
        "GET", "/broker"
    )
    assert (status, answer["detail"]) == (
        403,
        "user 'carol' is not in the admin group; the admin API is for administrators only",
    )
