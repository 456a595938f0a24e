"""The serving, planner, usage, MLflow and metrics endpoints x every kind of caller,
each cell asserting the exact status (the registry's own matrix is
tests/registry/api/test_authorization_matrix.py).

Members may retire and roll back what their department serves (only to a
version the deployment served before, which was approved to get there);
cancelling a rollout and reviewing a promotion take an approver.

Callers: anonymous, outsider (Finance member), member (Legal), approver (Legal),
token (Legal pipeline token, every ability), admin (platform staff).

The world each cell starts from: the deployment `staging-cpu` (two fake vLLM
replicas) serves Legal's `contracts` at v2 after v1, and a second deployment
`gated` asks for promotion approval and has a promotion of v1 pending.
"""

from __future__ import annotations

import pytest

from serving.models import Rollout, RolloutStatus
from serving.rollouts.engine import rollout_execute
from serving.services.promotions import promotion_create
from tests.conftest import actor, client_for
from tests.factories import make_approved_version
from tests.serving.conftest import make_deployment
from tests.support.adapters import AdapterSpec
from tests.support.authorization import (
    CALLERS,
    REVIEWERS,
    assert_status,
    caller_client,
    reviews,
    service_account_token,
    statuses,
)

# name: (method, path template, body builder, expected statuses)
MATRIX = {
    "list deployments": (
        "get",
        "/api/v1/deployments/",
        None,
        statuses(401, 200, 200, 200, 200, 200),
    ),
    "get deployment": (
        "get",
        "/api/v1/deployments/staging-cpu/",
        None,
        statuses(401, 200, 200, 200, 200, 200),
    ),
    "create deployment": (
        "post",
        "/api/v1/deployments/",
        lambda c: {
            "name": "another",
            "base_model_name": "tiny-llama",
            "replica_urls": ["http://127.0.0.1:9/"],
            "volume_write_path": c["volume"],
            "volume_serve_path": c["volume"],
        },
        statuses(401, 403, 403, 403, 403, 201),
    ),
    "update deployment": (
        "patch",
        "/api/v1/deployments/staging-cpu/",
        lambda c: {"description": "changed"},
        statuses(401, 403, 403, 403, 403, 200),
    ),
    "delete deployment": (
        "delete",
        "/api/v1/deployments/gated/",
        None,
        # Promotions point at it: the admin is refused with a conflict, nobody else gets that far.
        statuses(401, 403, 403, 403, 403, 409),
    ),
    "deployment state": (
        "get",
        "/api/v1/deployments/staging-cpu/state/",
        None,
        statuses(401, 200, 200, 200, 200, 200),
    ),
    "deployment placement": (
        "get",
        "/api/v1/deployments/staging-cpu/placement/",
        None,
        statuses(401, 200, 200, 200, 200, 200),
    ),
    "set placement bounds": (
        "put",
        "/api/v1/deployments/staging-cpu/placement/",
        lambda c: {"adapter": c["adapter"], "min_replicas": None, "max_replicas": 1},
        # Whoever may promote the adapter there: an outsider may not learn it exists.
        statuses(401, 404, 200, 200, 200, 200),
    ),
    "deployment drift events": (
        "get",
        "/api/v1/deployments/staging-cpu/drift-events/",
        None,
        statuses(401, 200, 200, 200, 200, 200),
    ),
    "deployment kserve manifests": (
        "get",
        "/api/v1/deployments/staging-cpu/kserve/",
        None,
        # Volume paths, claims, namespace, image: the platform's, not a department's.
        statuses(401, 403, 403, 403, 403, 200),
    ),
    "gate report": (
        "get",
        "/api/v1/deployments/staging-cpu/gate/?version={v1}",
        None,
        # The version is Legal's: an outsider may not learn it exists.
        statuses(401, 404, 200, 200, 200, 200),
    ),
    "roll deployment back": (
        "post",
        "/api/v1/deployments/staging-cpu/rollback/",
        lambda c: {"adapter": c["adapter"]},
        statuses(401, 404, 202, 202, 202, 202),
    ),
    "retire from deployment": (
        "post",
        "/api/v1/deployments/staging-cpu/retire/",
        lambda c: {"adapter": c["adapter"]},
        statuses(401, 404, 202, 202, 202, 202),
    ),
    "list promotions": (
        "get",
        "/api/v1/promotions/",
        None,
        statuses(401, 200, 200, 200, 200, 200),
    ),
    "get promotion": (
        "get",
        "/api/v1/promotions/{pending}/",
        None,
        statuses(401, 404, 200, 200, 200, 200),
    ),
    "promote": (
        "post",
        "/api/v1/promotions/",
        lambda c: {"deployment": "staging-cpu", "version": c["v3"]},
        statuses(401, 404, 201, 201, 201, 201),
    ),
    "approve promotion": (
        "post",
        "/api/v1/promotions/{pending}/approve/",
        None,
        # paula asked for it; alex is the second pair of eyes.
        statuses(401, 404, 403, 200, 403, 200),
    ),
    "reject promotion": (
        "post",
        "/api/v1/promotions/{pending}/reject/",
        lambda c: {"comment": "not yet"},
        statuses(401, 404, 403, 200, 403, 200),
    ),
    "list rollouts": (
        "get",
        "/api/v1/rollouts/",
        None,
        statuses(401, 200, 200, 200, 200, 200),
    ),
    "get rollout": (
        "get",
        "/api/v1/rollouts/{rollout}/",
        None,
        statuses(401, 404, 200, 200, 200, 200),
    ),
    "cancel rollout": (
        "post",
        "/api/v1/rollouts/{unfinished}/cancel/",
        lambda c: {"comment": "stop"},
        statuses(401, 404, 403, 200, 403, 200),
    ),
    "roll rollout back": (
        "post",
        "/api/v1/rollouts/{rollout}/rollback/",
        None,
        statuses(401, 404, 202, 202, 202, 202),
    ),
    "plan a deployment": (
        "post",
        "/api/v1/planner/",
        lambda c: {"deployment": "staging-cpu", "gpu_memory_bytes": 24 * 2**30},
        statuses(401, 200, 200, 200, 200, 200),
    ),
    "usage of a department": (
        "get",
        "/api/v1/usage/?department=legal",
        None,
        statuses(401, 404, 200, 200, 200, 200),
    ),
    "usage as csv": (
        "get",
        "/api/v1/usage/?format=csv",
        None,
        statuses(401, 200, 200, 200, 200, 200),
    ),
    "version mlflow mirror": (
        "get",
        "/api/v1/versions/{v1}/mlflow-mirror/",
        None,
        statuses(401, 404, 200, 200, 200, 200),
    ),
    "adapter mlflow aliases": (
        "get",
        "/api/v1/adapters/{adapter}/mlflow-aliases/",
        None,
        statuses(401, 404, 200, 200, 200, 200),
    ),
}

CELLS = [pytest.param(name, caller, id=f"{name}-{caller}") for name in MATRIX for caller in CALLERS]


@pytest.fixture
def world(
    legal, lena, alex, paula, root, contracts, approved_v1, approved_v2, fake_replicas, tmp_path
):
    urls = [r.base_url for r in fake_replicas]
    served = make_deployment(
        root, urls, tmp_path / "volume", base_model_pvc="base", adapter_pvc="adapters"
    )
    for version in (approved_v1, approved_v2):
        promotion = promotion_create(actor=actor(lena), deployment=served, version=version)
        assert rollout_execute(promotion.rollouts.get().pk, "w") == RolloutStatus.SUCCEEDED
    gated = make_deployment(
        root, urls, tmp_path / "gated", name="gated", requires_promotion_approval=True
    )
    pending = promotion_create(actor=actor(paula), deployment=gated, version=approved_v1)
    other = make_approved_version(lena, alex, contracts, AdapterSpec(seed=4))
    unfinished = Rollout.objects.create(
        deployment=gated,
        adapter=contracts,
        kind="promote",
        target_version=other,
        status=RolloutStatus.PENDING,
    )
    v3 = make_approved_version(lena, alex, contracts, AdapterSpec(seed=3))
    return {
        "adapter": contracts.pk,
        "v1": approved_v1.pk,
        "v3": v3.pk,
        "pending": pending.pk,
        "rollout": Rollout.objects.filter(deployment=served).order_by("-pk").first().pk,
        "unfinished": unfinished.pk,
        "volume": str(tmp_path / "another"),
    }


@pytest.mark.django_db
@pytest.mark.parametrize("endpoint,caller", CELLS)
def test_authorization_matrix(endpoint, caller, world, fred, lena, alex, root, legal_token):
    method, template, body, expected = MATRIX[endpoint]
    client = caller_client(caller, fred, lena, alex, root, legal_token)
    url = template.format(**world)
    data = body(world) if body else None
    response = getattr(client, method)(url, data, format="json")

    assert_status(response, expected[caller])


# The service-account paths on a deployment that requires promotion approval:
# a Legal service account's token asks to promote v3 to `gated`, then a reviewer
# answers. Before authors were recorded, the account's user was the requester
# on file and alex approved his own pipeline's request.
SERVICE_ACCOUNT_MATRIX = {
    # path: expected status of each reviewer's answer
    "alex's account, alex's token": reviews(403, 200, 200),
    "alex's account, paula's token": reviews(403, 403, 200),
    "root's account and token": reviews(200, 200, 403),
}
SERVICE_ACCOUNT_CELLS = [
    pytest.param(path, reviewer, action, id=f"{path}-{reviewer}-{action}")
    for path in SERVICE_ACCOUNT_MATRIX
    for reviewer in REVIEWERS
    for action in ("approve", "reject")
]


@pytest.mark.django_db
@pytest.mark.parametrize("path,reviewer,action", SERVICE_ACCOUNT_CELLS)
def test_four_eyes_counts_every_person_behind_a_service_accounts_promotion(
    path, reviewer, action, world, legal, alex, paula, root
):
    people = {"alex": alex, "paula": paula, "root": root}
    pipeline = client_for("token", service_account_token(path, legal, people))
    requested = pipeline.post(
        "/api/v1/promotions/", {"deployment": "gated", "version": world["v3"]}, format="json"
    )
    assert requested.status_code == 201, requested.json()
    assert requested.json()["status"] == "pending_approval"

    response = client_for(people[reviewer]).post(
        f"/api/v1/promotions/{requested.json()['id']}/{action}/",
        {"comment": "looked"},
        format="json",
    )

    expected = SERVICE_ACCOUNT_MATRIX[path][reviewer]
    assert_status(response, expected)
    if expected == 403:
        assert response.json()["error"]["code"] == "four_eyes"
        assert response.json()["error"]["message"].startswith("Four-eyes rule:")
