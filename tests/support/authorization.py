"""The six kinds of caller every authorization matrix checks, and what each cell asserts.

Callers: anonymous, outsider (Finance member), member (Legal), approver (Legal),
token (Legal pipeline token, every ability), admin (platform staff).

The service-account paths: work done through a Legal service account's token,
for each way its account and token came to be, and the answer each reviewer
gets. Four-eyes counts every person behind the work (core.access.can_review):
the account's creator and the token's minter may not review it.
"""

from __future__ import annotations

from core.models import Ability
from core.services.service_accounts import service_account_create, service_account_token_create
from tests.conftest import actor, client_for

CALLERS = ["anonymous", "outsider", "member", "approver", "token", "admin"]

# path: (who created the account, who minted its token); alex and paula approve
# for Legal, root is a platform admin.
SERVICE_ACCOUNT_PATHS = {
    "alex's account, alex's token": ("alex", "alex"),
    "alex's account, paula's token": ("alex", "paula"),
    "root's account and token": ("root", "root"),
}
REVIEWERS = ["alex", "paula", "root"]


def statuses(anonymous, outsider, member, approver, token, admin) -> dict[str, int]:
    return dict(zip(CALLERS, [anonymous, outsider, member, approver, token, admin], strict=True))


def reviews(alex, paula, root) -> dict[str, int]:
    return dict(zip(REVIEWERS, [alex, paula, root], strict=True))


def caller_client(caller, fred, lena, alex, root, legal_token):
    who = {"anonymous": None, "outsider": fred, "member": lena, "approver": alex, "admin": root}
    return client_for(who.get(caller, "token"), legal_token)


def service_account_token(path: str, department, people: dict, name: str = "pipeline"):
    """A token of a new service account of `department`, made as `path` says;
    `people` maps the cast's names to users. The secret is on `.secret`."""
    creator, minter = SERVICE_ACCOUNT_PATHS[path]
    account = service_account_create(actor=actor(people[creator]), department=department, name=name)
    token, secret = service_account_token_create(
        actor=actor(people[minter]), account=account, name="ci", abilities=list(Ability.values)
    )
    token.secret = secret
    return token


def assert_status(response, expected: int) -> None:
    """The exact status, and any refusal in the shared error envelope."""
    assert response.status_code == expected, getattr(response, "data", response.content[:500])
    if response.status_code >= 400:
        error = response.json()["error"]
        assert error["status"] == response.status_code
        assert error["message"]
