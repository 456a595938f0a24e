"""The inference-key, grant and adapter-callers endpoints x every kind of caller,
each cell asserting the exact status (the other serving endpoints:
test_authorization_matrix.py beside this file).

Keys are people's business: tokens get 403 on every key endpoint and on every
grant write. Outsiders get 404 for what is not theirs.

The world each cell starts from: Legal's adapters legal-contracts and
legal-memos; HR (hugo, a member) asked for legal-contracts (requested) and holds
an approved grant for legal-memos; Legal has a department key issued by alex.
fred (the outsider) is in Finance, a party to none of it.
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from core.models import Department, Membership, Role
from serving.services.grants import grant_decide, grant_request
from serving.services.inference_keys import inference_key_issue
from tests.conftest import actor
from tests.factories import make_adapter
from tests.support.authorization import CALLERS, assert_status, caller_client, statuses

KEY = {"name": "chat frontend", "expires_in_days": 30}

# name: (method, path template, body builder, expected statuses)
MATRIX = {
    "list inference keys": (
        "get",
        "/api/v1/inference-keys/",
        None,
        statuses(401, 200, 200, 200, 403, 200),
    ),
    "issue a department key": (
        "post",
        "/api/v1/inference-keys/",
        lambda c: {"department": "legal", **KEY},
        # Approvers issue the department's keys; a member only their own.
        statuses(401, 404, 403, 201, 403, 201),
    ),
    "issue a key of your own": (
        "post",
        "/api/v1/inference-keys/",
        lambda c: {"department": "legal", "holder": "person", **KEY},
        statuses(401, 404, 201, 201, 403, 201),
    ),
    "get an inference key": (
        "get",
        "/api/v1/inference-keys/{key}/",
        None,
        # A department key is its approvers' to see; a member is not told it exists.
        statuses(401, 404, 404, 200, 403, 200),
    ),
    "revoke an inference key": (
        "post",
        "/api/v1/inference-keys/{key}/revoke/",
        lambda c: {"reason": "leaked"},
        statuses(401, 404, 404, 200, 403, 200),
    ),
    "list grants": (
        "get",
        "/api/v1/grants/",
        None,
        statuses(401, 200, 200, 200, 200, 200),
    ),
    "ask for a grant": (
        "post",
        "/api/v1/grants/",
        lambda c: {
            "served_name": "legal-contracts",
            "department": "finance",
            "reason": "invoice checks",
            "expires_in_days": 30,
        },
        # Asked by a member of the calling department (fred is Finance's).
        statuses(401, 201, 404, 404, 403, 201),
    ),
    "get a grant": (
        "get",
        "/api/v1/grants/{asked}/",
        None,
        statuses(401, 404, 200, 200, 200, 200),
    ),
    "approve a grant": (
        "post",
        "/api/v1/grants/{asked}/approve/",
        lambda c: {"comment": "fine"},
        # An approver of the adapter's department; hugo asked, so alex is the second pair of eyes.
        statuses(401, 404, 403, 200, 403, 200),
    ),
    "refuse a grant": (
        "post",
        "/api/v1/grants/{asked}/refuse/",
        lambda c: {"comment": "not this quarter"},
        statuses(401, 404, 403, 200, 403, 200),
    ),
    "revoke a grant": (
        "post",
        "/api/v1/grants/{approved}/revoke/",
        lambda c: {"comment": "project over"},
        statuses(401, 404, 403, 200, 403, 200),
    ),
    "who may call an adapter": (
        "get",
        "/api/v1/adapters/{adapter}/callers/",
        None,
        statuses(401, 404, 200, 200, 200, 200),
    ),
}

CELLS = [pytest.param(name, caller, id=f"{name}-{caller}") for name in MATRIX for caller in CALLERS]


@pytest.fixture
def world(legal, lena, alex, root, contracts):
    hr = Department.objects.create(slug="hr", name="HR")
    hugo = get_user_model().objects.create_user(username="hugo", password="x" * 20)
    Membership.objects.create(user=hugo, department=hr, role=Role.MEMBER)
    make_adapter(lena, legal, name="memos", served_name="legal-memos")

    def ask(served_name):
        return grant_request(
            actor=actor(hugo),
            department=hr,
            served_name=served_name,
            expires_in_days=30,
            reason="x",
        )

    asked = ask("legal-contracts")
    approved = grant_decide(actor=actor(alex), grant=ask("legal-memos"), approve=True)
    key, _ = inference_key_issue(actor=actor(alex), department=legal, **KEY)
    return {"adapter": contracts.pk, "asked": asked.pk, "approved": approved.pk, "key": key.pk}


@pytest.mark.django_db
@pytest.mark.parametrize("endpoint,caller", CELLS)
def test_authorization_matrix(endpoint, caller, world, fred, lena, alex, root, legal_token):
    method, template, body, expected = MATRIX[endpoint]
    client = caller_client(caller, fred, lena, alex, root, legal_token)
    url = template.format(**world)
    data = body(world) if body else None
    response = getattr(client, method)(url, data, format="json")

    assert_status(response, expected[caller])
