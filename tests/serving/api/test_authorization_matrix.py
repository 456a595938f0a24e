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
from django.test import override_settings

from core.models import Ability, Department, Membership, Role
from core.services.tokens import token_create
from registry.artifact_store import get_artifact_store
from serving.models import Rollout, RolloutStatus
from serving.rollouts.engine import rollout_execute
from serving.services.promotions import promotion_create
from tests.conftest import _user, actor, client_for
from tests.factories import make_adapter, make_approved_version
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
from tests.support.module_db import kept_for_the_module
from tests.support.vllm_standin import serve_standin

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


# The world is built once for the module (tests/support/module_db.py): each cell
# only makes requests, and its writes roll back to the world. Built per cell, it
# took about a quarter of the light run's time (two rollouts each).
@pytest.fixture(scope="module")
def cast_and_world(django_db_setup, django_db_blocker, tmp_path_factory):
    folder = tmp_path_factory.mktemp("matrix")
    replicas = [serve_standin(), serve_standin()]
    # What tests/conftest.py's isolated_storage and tests/serving/conftest.py's
    # fast_retries set for each test, held for the module's world.
    kept = override_settings(
        ARTIFACT_STORE_URL=(folder / "artifacts").as_uri(),
        INGEST_STAGING_DIR=folder / "ingest",
        SERVING_RETRY_DEADLINE_SECONDS=1.0,
        SERVING_RETRY_BASE_SECONDS=0.05,
        SERVING_RETRY_MAX_DELAY_SECONDS=0.2,
    )
    try:
        with kept, kept_for_the_module(django_db_blocker):
            get_artifact_store.cache_clear()
            yield build_world(folder, [replica.base_url for replica in replicas])
    finally:
        get_artifact_store.cache_clear()
        for replica in replicas:
            replica.close()


def build_world(folder, urls) -> dict:
    legal = Department.objects.create(slug="legal", name="Legal")
    finance = Department.objects.create(slug="finance", name="Finance")
    people = {"root": _user("root", is_staff=True, is_superuser=True)}
    for name, department, role in (
        ("lena", legal, Role.MEMBER),
        ("alex", legal, Role.APPROVER),
        ("paula", legal, Role.APPROVER),
        ("fred", finance, Role.MEMBER),
    ):
        people[name] = _user(name)
        Membership.objects.create(user=people[name], department=department, role=role)
    lena, alex, paula, root = (people[name] for name in ("lena", "alex", "paula", "root"))
    token, secret = token_create(
        actor=actor(lena), department=legal, name="ci", abilities=list(Ability.values)
    )
    token.secret = secret
    contracts = make_adapter(lena, legal, name="contracts", served_name="legal-contracts")
    approved_v1 = make_approved_version(lena, alex, contracts, AdapterSpec(seed=1))
    approved_v2 = make_approved_version(lena, alex, contracts, AdapterSpec(seed=2))
    served = make_deployment(
        root, urls, folder / "volume", base_model_pvc="base", adapter_pvc="adapters"
    )
    for version in (approved_v1, approved_v2):
        promotion = promotion_create(actor=actor(lena), deployment=served, version=version)
        assert rollout_execute(promotion.rollouts.get().pk, "w") == RolloutStatus.SUCCEEDED
    gated = make_deployment(
        root, urls, folder / "gated", name="gated", requires_promotion_approval=True
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
    world = {
        "adapter": contracts.pk,
        "v1": approved_v1.pk,
        "v3": v3.pk,
        "pending": pending.pk,
        "rollout": Rollout.objects.filter(deployment=served).order_by("-pk").first().pk,
        "unfinished": unfinished.pk,
        "volume": str(folder / "another"),
    }
    return {**people, "legal": legal, "legal_token": token, "folder": folder, "world": world}


# The cast of tests/conftest.py, as the module's world holds it.
@pytest.fixture(autouse=True)
def isolated_storage(settings, cast_and_world):
    folder = cast_and_world["folder"]
    settings.ARTIFACT_STORE_URL = (folder / "artifacts").as_uri()
    settings.INGEST_STAGING_DIR = folder / "ingest"


@pytest.fixture
def world(cast_and_world, db):
    return cast_and_world["world"]


@pytest.fixture
def legal(cast_and_world, db):
    return cast_and_world["legal"]


@pytest.fixture
def legal_token(cast_and_world, db):
    return cast_and_world["legal_token"]


@pytest.fixture
def root(cast_and_world, db):
    return cast_and_world["root"]


@pytest.fixture
def lena(cast_and_world, db):
    return cast_and_world["lena"]


@pytest.fixture
def alex(cast_and_world, db):
    return cast_and_world["alex"]


@pytest.fixture
def paula(cast_and_world, db):
    return cast_and_world["paula"]


@pytest.fixture
def fred(cast_and_world, db):
    return cast_and_world["fred"]


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
