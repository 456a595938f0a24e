"""GET and PUT /api/v1/deployments/<name>/placement/: where each adapter lives
and why, and the bounds that decide it. Members see replica labels, never
addresses; only adapters of their own departments."""

from __future__ import annotations

import pytest

from core.models import AuditEvent
from serving.models import Replica, ServedAdapter
from serving.reconcile.tick import reconcile_deployment
from serving.rollouts.engine import rollout_execute
from tests.serving.test_rollouts import promote

pytestmark = pytest.mark.django_db

URL = "/api/v1/deployments/staging-cpu/placement/"


@pytest.fixture
def served(lena, deployment, approved_v1):
    assert rollout_execute(promote(lena, deployment, approved_v1)[1].pk, "w") == "succeeded"
    return ServedAdapter.objects.get(deployment=deployment)


def test_an_adapter_without_bounds_is_everywhere(as_lena, served):
    response = as_lena.get(URL)
    assert response.status_code == 200, response.json()
    [row] = response.json()
    assert row["served_name"] == "legal-contracts"
    assert row["reason"] == "everywhere"
    assert [r["label"] for r in row["replicas"]] == ["replica-1", "replica-2"]
    assert row["min_replicas"] is None and row["max_replicas"] is None


def test_bounds_set_are_audited_and_the_reconcile_places_the_adapter(
    as_lena, served, deployment, contracts, fake_replicas
):
    response = as_lena.put(
        URL, {"adapter": contracts.pk, "min_replicas": None, "max_replicas": 1}, format="json"
    )
    assert response.status_code == 200, response.json()
    assert response.json()["reason"] == "pending"
    assert AuditEvent.objects.filter(action="placement.bounds_set").count() == 1

    reconcile_deployment(deployment.pk, "beat")
    reconcile_deployment(deployment.pk, "beat")  # the second copy goes once the first serves
    [row] = as_lena.get(URL).json()
    assert row["wanted"] == 1 and len(row["replicas"]) == 1
    # Idle, with the min being the max (1): held there.
    assert row["reason"] == "min"
    assert row["reason_text"] == "held at min_replicas"
    assert sum("legal-contracts" in r.adapters for r in fake_replicas) == 1


def test_members_see_labels_and_admins_addresses(as_lena, as_root, served, contracts):
    as_root.put(URL, {"adapter": contracts.pk, "min_replicas": 1, "max_replicas": 1}, format="json")
    reconcile_deployment(served.deployment_id, "beat")
    member = as_lena.get(URL).json()[0]["replicas"]
    admin = as_root.get(URL).json()[0]["replicas"]
    assert member and all(set(r) == {"label", "health"} for r in member)
    urls = set(Replica.objects.values_list("base_url", flat=True))
    assert admin and all(r["base_url"] in urls for r in admin)
    assert not any(url in str(as_lena.get(URL).json()) for url in urls)


def test_an_outsider_sees_none_of_the_departments_adapters(as_fred, served):
    response = as_fred.get(URL)
    assert response.status_code == 200
    assert response.json() == []


@pytest.mark.parametrize(
    "body,field",
    [
        ({"min_replicas": 3, "max_replicas": 2}, "min_replicas"),
        ({"min_replicas": 0, "max_replicas": None}, "min_replicas"),
        ({"min_replicas": None, "max_replicas": 5000}, "max_replicas"),
        ({"min_replicas": None}, "max_replicas"),
    ],
)
def test_bad_bounds_are_a_400_naming_the_field(as_lena, served, contracts, body, field):
    response = as_lena.put(URL, {"adapter": contracts.pk, **body}, format="json")
    assert response.status_code == 400, response.json()
    assert field in str(response.json())


def test_bounds_may_be_set_before_the_first_promotion(as_lena, deployment, contracts):
    response = as_lena.put(
        URL, {"adapter": contracts.pk, "min_replicas": None, "max_replicas": 1}, format="json"
    )
    assert response.status_code == 200, response.json()
    assert response.json()["version"] is None
    assert ServedAdapter.objects.get(deployment=deployment, adapter=contracts).max_replicas == 1
