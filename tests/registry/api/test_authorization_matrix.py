"""Every endpoint x every kind of caller, each cell asserting the exact status.

Callers: anonymous, outsider (Finance member), member (Legal), approver (Legal),
token (Legal pipeline token, every ability), admin (platform staff).
"""

from __future__ import annotations

import pytest

from registry.models import VersionStatus
from registry.services.versions import version_transition
from tests.conftest import actor, client_for
from tests.factories import archive_upload, make_adapter, make_version
from tests.support.authorization import (
    CALLERS,
    REVIEWERS,
    assert_status,
    caller_client,
    reviews,
    service_account_token,
    statuses,
)

# name: (method, path template, body builder, version state needed, expected statuses)
MATRIX = {
    "list departments": (
        "get",
        "/api/v1/departments/",
        None,
        None,
        statuses(401, 200, 200, 200, 200, 200),
    ),
    "get department": (
        "get",
        "/api/v1/departments/legal/",
        None,
        None,
        statuses(401, 404, 200, 200, 200, 200),
    ),
    "create department": (
        "post",
        "/api/v1/departments/",
        lambda c: {"slug": "ops", "name": "Ops"},
        None,
        statuses(401, 403, 403, 403, 403, 201),
    ),
    "list memberships": (
        "get",
        "/api/v1/departments/legal/memberships/",
        None,
        None,
        statuses(401, 404, 200, 200, 200, 200),
    ),
    "set membership": (
        "post",
        "/api/v1/departments/legal/memberships/",
        lambda c: {"username": "fred", "role": "member"},
        None,
        statuses(401, 404, 403, 403, 403, 200),
    ),
    "remove membership": (
        "delete",
        "/api/v1/departments/legal/memberships/paula/",
        None,
        None,
        statuses(401, 404, 403, 403, 403, 204),
    ),
    "list adapters": (
        "get",
        "/api/v1/adapters/",
        None,
        None,
        statuses(401, 200, 200, 200, 200, 200),
    ),
    "create adapter": (
        "post",
        "/api/v1/adapters/",
        lambda c: {"department": "legal", "name": "nda", "base_model": "tiny-llama"},
        None,
        statuses(401, 404, 201, 201, 201, 201),
    ),
    "get adapter": (
        "get",
        "/api/v1/adapters/{adapter}/",
        None,
        None,
        statuses(401, 404, 200, 200, 200, 200),
    ),
    "update adapter": (
        "patch",
        "/api/v1/adapters/{adapter}/",
        lambda c: {"description": "new"},
        None,
        statuses(401, 404, 200, 200, 200, 200),
    ),
    "list adapter versions": (
        "get",
        "/api/v1/adapters/{adapter}/versions/",
        None,
        None,
        statuses(401, 404, 200, 200, 200, 200),
    ),
    "register version": (
        "post_multipart",
        "/api/v1/adapters/{adapter}/versions/",
        lambda c: {"files": [archive_upload()]},
        None,
        statuses(401, 404, 201, 201, 201, 201),
    ),
    "list versions": (
        "get",
        "/api/v1/versions/",
        None,
        None,
        statuses(401, 200, 200, 200, 200, 200),
    ),
    "get version": (
        "get",
        "/api/v1/versions/{version}/",
        None,
        VersionStatus.REGISTERED,
        statuses(401, 404, 200, 200, 200, 200),
    ),
    "submit": (
        "post",
        "/api/v1/versions/{version}/submit/",
        None,
        VersionStatus.REGISTERED,
        statuses(401, 404, 200, 200, 200, 200),
    ),
    "approve": (
        "post",
        "/api/v1/versions/{version}/approve/",
        None,
        VersionStatus.PENDING_REVIEW,
        statuses(401, 404, 403, 200, 403, 200),
    ),
    "reject": (
        "post",
        "/api/v1/versions/{version}/reject/",
        lambda c: {"comment": "no"},
        VersionStatus.PENDING_REVIEW,
        statuses(401, 404, 403, 200, 403, 200),
    ),
    "deprecate": (
        "post",
        "/api/v1/versions/{version}/deprecate/",
        None,
        VersionStatus.APPROVED,
        statuses(401, 404, 403, 200, 403, 200),
    ),
    "archive": (
        "post",
        "/api/v1/versions/{version}/archive/",
        None,
        VersionStatus.DEPRECATED,
        statuses(401, 404, 403, 200, 403, 200),
    ),
    "list audit events": (
        "get",
        "/api/v1/audit-events/",
        None,
        None,
        statuses(401, 200, 200, 200, 200, 200),
    ),
    "list tokens": ("get", "/api/v1/tokens/", None, None, statuses(401, 200, 200, 200, 200, 200)),
    "create token": (
        "post",
        "/api/v1/tokens/",
        lambda c: {"department": "legal", "name": "ci2", "abilities": ["versions:register"]},
        None,
        statuses(401, 404, 201, 201, 403, 201),
    ),
    "revoke token": (
        "post",
        "/api/v1/tokens/{token}/revoke/",
        None,
        None,
        statuses(401, 404, 200, 404, 404, 200),
    ),
    "openapi schema": ("get", "/api/schema/", None, None, statuses(200, 200, 200, 200, 200, 200)),
    "liveness": ("get", "/livez", None, None, statuses(200, 200, 200, 200, 200, 200)),
    "readiness": ("get", "/readyz", None, None, statuses(200, 200, 200, 200, 200, 200)),
}

STEPS = {
    VersionStatus.REGISTERED: [],
    VersionStatus.PENDING_REVIEW: ["submit"],
    VersionStatus.APPROVED: ["submit", "approve"],
    VersionStatus.DEPRECATED: ["submit", "approve", "deprecate"],
}

CELLS = [pytest.param(name, caller, id=f"{name}-{caller}") for name in MATRIX for caller in CALLERS]


@pytest.mark.django_db
@pytest.mark.parametrize("endpoint,caller", CELLS)
def test_authorization_matrix(
    endpoint, caller, legal, finance, lena, alex, paula, fred, root, legal_token
):
    method, template, body, state, expected = MATRIX[endpoint]
    adapter = make_adapter(lena, legal, name="contracts")
    context = {"adapter": adapter.pk, "token": legal_token.pk, "version": ""}
    if state is not None:
        version = make_version(lena, adapter)
        for step in STEPS[state]:
            who = paula if step in {"approve", "deprecate"} else lena
            version = version_transition(actor=actor(who), version=version, action=step)
        context["version"] = version.pk
    client = caller_client(caller, fred, lena, alex, root, legal_token)
    url = template.format(**context)
    data = body(context) if body else None
    if method == "post_multipart":
        response = client.post(url, data, format="multipart")
    else:
        response = getattr(client, method)(url, data, format="json")

    assert_status(response, expected[caller])


# The service-account paths: a version registered and submitted through a Legal
# service account's token, or registered by lena and submitted through it, then
# reviewed. Before authors were recorded, alex approved what his own pipeline
# registered: the account's user, not alex, was the author on file.
SERVICE_ACCOUNT_MATRIX = {
    # path: expected status of each reviewer's approval
    "alex's account, alex's token": reviews(403, 200, 200),
    "alex's account, paula's token": reviews(403, 403, 200),
    "root's account and token": reviews(200, 200, 403),
}
SERVICE_ACCOUNT_CELLS = [
    pytest.param(path, acts, reviewer, action, id=f"{path}-{acts}-{reviewer}-{action}")
    for path in SERVICE_ACCOUNT_MATRIX
    for acts in ("registers and submits", "submits")
    for reviewer in REVIEWERS
    for action in ("approve", "reject")
]


@pytest.mark.django_db
@pytest.mark.parametrize("path,acts,reviewer,action", SERVICE_ACCOUNT_CELLS)
def test_four_eyes_counts_every_person_behind_a_service_accounts_work(
    path, acts, reviewer, action, legal, lena, alex, paula, root
):
    people = {"alex": alex, "paula": paula, "root": root}
    pipeline = client_for("token", service_account_token(path, legal, people))
    adapter = make_adapter(lena, legal, name="contracts")
    if acts == "registers and submits":
        registered = pipeline.post(
            f"/api/v1/adapters/{adapter.pk}/versions/",
            {"files": [archive_upload()]},
            format="multipart",
        )
        assert registered.status_code == 201, registered.json()
        version_id = registered.json()["id"]
    else:
        version_id = make_version(lena, adapter).pk
    submitted = pipeline.post(f"/api/v1/versions/{version_id}/submit/")
    assert submitted.status_code == 200, submitted.json()

    response = client_for(people[reviewer]).post(
        f"/api/v1/versions/{version_id}/{action}/", {"comment": "looked"}, format="json"
    )

    expected = SERVICE_ACCOUNT_MATRIX[path][reviewer]
    assert_status(response, expected)
    if expected == 403:
        assert response.json()["error"]["code"] == "four_eyes"
        assert response.json()["error"]["message"].startswith("Four-eyes rule:")
