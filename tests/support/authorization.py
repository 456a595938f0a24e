"""The six kinds of caller every authorization matrix checks, and what each cell asserts.

Callers: anonymous, outsider (Finance member), member (Legal), approver (Legal),
token (Legal pipeline token, every ability), admin (platform staff).
"""

from __future__ import annotations

from tests.conftest import client_for

CALLERS = ["anonymous", "outsider", "member", "approver", "token", "admin"]


def statuses(anonymous, outsider, member, approver, token, admin) -> dict[str, int]:
    return dict(zip(CALLERS, [anonymous, outsider, member, approver, token, admin], strict=True))


def caller_client(caller, fred, lena, alex, root, legal_token):
    who = {"anonymous": None, "outsider": fred, "member": lena, "approver": alex, "admin": root}
    return client_for(who.get(caller, "token"), legal_token)


def assert_status(response, expected: int) -> None:
    """The exact status, and any refusal in the shared error envelope."""
    assert response.status_code == expected, getattr(response, "data", response.content[:500])
    if response.status_code >= 400:
        error = response.json()["error"]
        assert error["status"] == response.status_code
        assert error["message"]
