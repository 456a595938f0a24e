"""door_access (serving/door/selectors.py): the table a deployment's front door
enforces, read in a fixed number of queries. What the door does with it, against
real HAProxy and real vLLM, is the door's own tests."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest
from django.utils import timezone

from core.models import Membership, Role
from core.services.service_accounts import service_account_create, service_account_deactivate
from serving.door.callers import CallerKey
from serving.door.haproxy.maps import access_maps
from serving.door.selectors import door_access
from serving.models import AdapterGrant, GrantStatus, InferenceKey, ServedAdapter
from serving.services.inference_keys import hash_inference_key, inference_key_issue
from tests.conftest import actor
from tests.factories import make_adapter, make_approved_version
from tests.serving.conftest import make_deployment
from tests.support.adapters import AdapterSpec

pytestmark = pytest.mark.django_db


@pytest.fixture
def served(root, lena, alex, fred, legal, finance, contracts, tmp_path):
    """staging-cpu serves Legal's legal-contracts and Finance's finance-invoices."""
    deployment = make_deployment(root, ["http://127.0.0.1:9/"], tmp_path / "volume")
    invoices = make_adapter(fred, finance, name="invoices", served_name="finance-invoices")
    fiona = _approver_of(finance, "fiona")
    for adapter, (author, approver) in ((contracts, (lena, alex)), (invoices, (fred, fiona))):
        version = make_approved_version(author, approver, adapter, AdapterSpec(seed=adapter.pk))
        ServedAdapter.objects.create(deployment=deployment, adapter=adapter, version=version)
    return deployment


def _approver_of(department, username):
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user(username=username, password="x" * 20)
    Membership.objects.create(user=user, department=department, role=Role.APPROVER)
    return user


def _key(who, department, holder="department", **extra):
    key, secret = inference_key_issue(
        actor=actor(who),
        department=department,
        name="k",
        expires_in_days=30,
        holder=holder,
        **extra,
    )
    return key, secret


def test_a_key_is_found_by_the_sha256_of_its_secret_and_calls_as_its_department(
    served, alex, legal
):
    key, secret = _key(alex, legal)

    access = door_access(served)

    assert access.keys == {
        hash_inference_key(secret): CallerKey(
            key_id=key.pk, department="legal", expires_at=int(key.expires_at.timestamp())
        )
    }
    assert hash_inference_key(secret) == hashlib.sha256(secret.encode()).hexdigest()
    assert access.open is False


def test_the_door_is_told_the_version_each_adapter_serves_for_its_request_ids(served):
    access = door_access(served)

    expected = dict(
        ServedAdapter.objects.filter(deployment=served).values_list(
            "adapter__served_name", "version_id"
        )
    )
    assert access.versions == expected
    assert set(expected) == {"legal-contracts", "finance-invoices"}
    assert access_maps(access)["versions"] == {name: str(v) for name, v in expected.items()}


def test_each_department_calls_the_base_model_and_its_own_adapters_only(served):
    access = door_access(served)

    assert access.models_for("legal") == ["legal-contracts", "tiny-llama"]
    assert access.models_for("finance") == ["finance-invoices", "tiny-llama"]


def test_a_deployment_limited_to_some_departments_lets_only_those_call(served, legal):
    served.allowed_departments.set([legal])

    access = door_access(served)

    assert access.models_for("legal") == ["legal-contracts", "tiny-llama"]
    assert access.models_for("finance") == []


def test_a_retired_adapter_is_called_by_nobody(served, contracts):
    ServedAdapter.objects.filter(adapter=contracts).update(version=None)

    assert "legal-contracts" not in door_access(served).models_for("legal")


def test_an_approved_unexpired_grant_lets_the_other_department_call_that_adapter(
    served, contracts, finance, fred, legal
):
    grant = AdapterGrant.objects.create(
        adapter=contracts,
        department=finance,
        status=GrantStatus.APPROVED,
        expires_at=timezone.now() + timedelta(days=1),
        requested_by=fred,
    )
    # Even where the deployment takes only Legal's adapters: Legal agreed.
    served.allowed_departments.set([legal])

    assert door_access(served).models_for("finance") == ["legal-contracts"]

    for status, expires in (
        (GrantStatus.REQUESTED, timedelta(days=1)),
        (GrantStatus.REVOKED, timedelta(days=1)),
        (GrantStatus.APPROVED, -timedelta(seconds=1)),
    ):
        AdapterGrant.objects.filter(pk=grant.pk).update(
            status=status, expires_at=timezone.now() + expires
        )
        assert door_access(served).models_for("finance") == [], status


def test_a_grant_s_end_is_in_the_door_s_table_and_its_own_department_needs_none(
    served, contracts, finance, fred, legal
):
    ends = timezone.now() + timedelta(hours=5)
    AdapterGrant.objects.create(
        adapter=contracts,
        department=finance,
        status=GrantStatus.APPROVED,
        expires_at=ends,
        requested_by=fred,
    )
    access = door_access(served)

    assert access.grant_ends == {("finance", "legal-contracts"): int(ends.timestamp())}
    maps = access_maps(access)["grants"]
    assert maps["finance:legal-contracts"] == str(int(ends.timestamp()))
    assert maps["legal:legal-contracts"] == "0"


def test_revoked_and_expired_keys_are_not_in_the_table(served, alex, legal):
    revoked, _ = _key(alex, legal)
    expired, _ = _key(alex, legal)
    live, _ = _key(alex, legal)
    InferenceKey.objects.filter(pk=revoked.pk).update(revoked_at=timezone.now())
    InferenceKey.objects.filter(pk=expired.pk).update(expires_at=timezone.now())

    assert [k.key_id for k in door_access(served).keys.values()] == [live.pk]


def test_a_persons_key_counts_while_they_are_active_and_a_member(served, lena, legal):
    key, _ = _key(lena, legal, holder="person")
    assert [k.key_id for k in door_access(served).keys.values()] == [key.pk]

    Membership.objects.filter(user=lena, department=legal).delete()
    assert door_access(served).keys == {}

    Membership.objects.create(user=lena, department=legal, role=Role.MEMBER)
    type(lena).objects.filter(pk=lena.pk).update(is_active=False)
    assert door_access(served).keys == {}


def test_a_deactivated_service_account_takes_its_keys_out_at_once(served, alex, legal):
    account = service_account_create(actor=actor(alex), department=legal, name="chatbot")
    key, _ = _key(alex, legal, holder="service_account", service_account=account)
    assert [k.key_id for k in door_access(served).keys.values()] == [key.pk]

    service_account_deactivate(actor=actor(alex), account=account)

    assert door_access(served).keys == {}
    key.refresh_from_db()
    assert key.revoked_at is not None


def test_an_open_deployment_says_so(served, root):
    from serving.services.deployments import deployment_update

    deployment_update(actor=actor(root), deployment=served, open_door=True)

    assert door_access(served).open is True


def test_the_table_takes_six_queries_whatever_the_number_of_keys_and_grants(
    served, alex, legal, finance, fred, contracts, django_assert_num_queries
):
    def grow(n):
        for _ in range(n):
            _key(alex, legal)
            _key(fred, finance, holder="person")

    grow(1)
    # Keys, departments, served, grants; key limits, department limits.
    with django_assert_num_queries(6):
        small = door_access(served)
    grow(20)
    AdapterGrant.objects.create(
        adapter=contracts,
        department=finance,
        status=GrantStatus.APPROVED,
        expires_at=timezone.now() + timedelta(days=1),
        requested_by=fred,
    )
    with django_assert_num_queries(6):
        large = door_access(served)

    assert (len(small.keys), len(large.keys)) == (2, 42)


def test_opening_a_deployment_enqueues_its_door_sync_after_commit_and_shows_in_readyz(
    served, root, anonymous, door_syncs
):
    from serving.services.deployments import deployment_update

    assert "notice" not in anonymous.get("/readyz").json()["checks"]["open_doors"]
    with door_syncs() as sent:
        deployment_update(actor=actor(root), deployment=served, open_door=True)
    assert sent == [served.pk]

    with door_syncs() as sent:
        deployment_update(actor=actor(root), deployment=served, description="unrelated")
    assert sent == []

    check = anonymous.get("/readyz").json()["checks"]["open_doors"]
    assert check == {
        "ok": True,
        "optional": True,
        "notice": "front door open (no inference key needed): staging-cpu",
    }


def test_the_sync_task_hands_the_deployment_to_the_door_side(served, monkeypatch):
    from serving.door import services as door_services
    from serving.tasks import door_access_sync

    synced = []
    monkeypatch.setattr(door_services, "door_sync_access", synced.append, raising=False)

    assert door_access_sync(served.pk) is True
    assert synced == [served]
    assert door_access_sync(served.pk + 1000) is False


def test_the_table_carries_the_replicas_key_out_of_its_repr_and_a_new_key_is_pushed(
    served, root, door_syncs
):
    from serving.services.deployments import deployment_update

    assert door_access(served).upstream_key == ""
    with door_syncs() as sent:
        deployment_update(actor=actor(root), deployment=served, vllm_api_key="vllm-key-012345")
    assert sent == [served.pk]

    access = door_access(served)
    assert access.upstream_key == "vllm-key-012345"
    assert "vllm-key-012345" not in repr(access)
