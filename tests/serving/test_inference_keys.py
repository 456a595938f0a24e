"""Inference keys (serving/services/inference_keys.py): who may issue and
revoke them, the secret kept nowhere but the caller's hands, the expiry bounds,
the audit, and every change sent to the front doors after commit. A person
ended by SCIM loses their keys at the door."""

from __future__ import annotations

import json
import logging
from unittest import mock

import pytest
from django.contrib.auth import get_user_model
from django.core import serializers
from django.test import Client

from core.errors import Conflict, NotAuthorized, NotFound, ValidationFailed
from core.models import AuditEvent
from core.services.people import user_update
from core.services.service_accounts import service_account_create
from serving.door.selectors import door_access
from serving.models import InferenceKey
from serving.services.inference_keys import (
    KEY_PREFIX,
    hash_inference_key,
    inference_key_issue,
    inference_key_revoke,
)
from sso.group_map import parse_group_map
from sso.scim.tokens import scim_token_create
from tests.conftest import actor
from tests.serving.conftest import make_deployment

pytestmark = pytest.mark.django_db


def _issue(who, department, holder="department", days=30, token=None, **extra):
    return inference_key_issue(
        actor=actor(who, token),
        department=department,
        name="chat frontend",
        expires_in_days=days,
        holder=holder,
        **extra,
    )


@pytest.fixture
def deployment(root, tmp_path):
    return make_deployment(root, ["http://127.0.0.1:9/"], tmp_path / "volume")


def test_the_secret_is_returned_once_and_only_its_sha256_is_stored_or_logged(alex, legal, caplog):
    caplog.set_level(logging.DEBUG)

    key, secret = _issue(alex, legal)

    assert secret.startswith(KEY_PREFIX) and len(secret) > 40
    assert key.secret_sha256 == hash_inference_key(secret)
    assert key.prefix == secret[:12] and secret[12:] not in key.prefix
    stored = serializers.serialize("json", InferenceKey.objects.all())
    audited = serializers.serialize("json", AuditEvent.objects.all())
    assert secret[len(KEY_PREFIX) :] not in stored + audited + caplog.text
    assert key.secret_sha256 in stored


def test_issuing_is_audited_with_its_prefix_holder_and_expiry(alex, legal):
    key, _ = _issue(alex, legal)

    event = AuditEvent.objects.get(action="inference_key.issued")
    assert (event.object_id, event.department_id) == (str(key.pk), legal.pk)
    assert event.actor_id == alex.pk
    assert event.details["prefix"] == key.prefix
    assert event.details["holder"] == "department legal"
    assert event.details["expires_at"] == key.expires_at.isoformat()


@pytest.mark.parametrize("days", [0, -1, 366, True, "30", None])
def test_an_expiry_outside_one_day_to_the_maximum_is_refused_and_nothing_is_written(
    alex, legal, days
):
    with pytest.raises(ValidationFailed, match="between 1 and 365"):
        _issue(alex, legal, days=days)

    assert not InferenceKey.objects.exists()
    assert not AuditEvent.objects.filter(action="inference_key.issued").exists()


def test_the_maximum_lifetime_is_a_setting(alex, legal, settings):
    settings.SERVING_INFERENCE_KEY_MAX_DAYS = 7

    with pytest.raises(ValidationFailed, match="between 1 and 7"):
        _issue(alex, legal, days=8)
    assert _issue(alex, legal, days=7)[0].pk


def test_a_member_issues_a_key_for_themselves_but_not_for_the_department(lena, legal):
    key, _ = _issue(lena, legal, holder="person")
    assert key.person == lena

    with pytest.raises(NotAuthorized):
        _issue(lena, legal)


def test_an_outsider_is_told_the_department_does_not_exist(fred, legal):
    with pytest.raises(NotFound):
        _issue(fred, legal, holder="person")


def test_a_token_never_issues_a_key(lena, legal, legal_token):
    with pytest.raises(NotAuthorized, match="Tokens cannot"):
        _issue(lena, legal, holder="person", token=legal_token)


def test_a_service_accounts_key_needs_an_active_account_of_that_department(
    alex, root, legal, finance
):
    account = service_account_create(actor=actor(alex), department=legal, name="bot")
    key, _ = _issue(alex, legal, holder="service_account", service_account=account)
    assert (key.service_account, key.person) == (account, None)

    other = service_account_create(actor=actor(root), department=finance, name="bot")
    with pytest.raises(NotFound):
        _issue(root, legal, holder="service_account", service_account=other)


def test_revoking_takes_the_key_out_of_the_table_and_a_second_revoke_is_a_conflict(
    alex, legal, deployment
):
    key, secret = _issue(alex, legal)
    assert hash_inference_key(secret) in door_access(deployment).keys

    inference_key_revoke(actor=actor(alex), key=key, reason="leaked in a ticket")

    assert hash_inference_key(secret) not in door_access(deployment).keys
    event = AuditEvent.objects.get(action="inference_key.revoked")
    assert (event.actor_id, event.comment) == (alex.pk, "leaked in a ticket")
    with pytest.raises(Conflict, match="already revoked"):
        inference_key_revoke(actor=actor(alex), key=key)


def test_a_person_revokes_their_own_key_and_no_other_member_sees_it(lena, legal, paula):
    from tests.conftest import _user

    key, _ = _issue(lena, legal, holder="person")
    colleague = _user("colin")
    colleague.memberships.create(department=legal, role="member")

    with pytest.raises(NotFound):
        inference_key_revoke(actor=actor(colleague), key=key)
    inference_key_revoke(actor=actor(lena), key=key)
    assert InferenceKey.objects.get(pk=key.pk).revoked_by == lena


def test_an_approver_of_another_department_gets_a_404(alex, fred, legal):
    key, _ = _issue(alex, legal)

    with pytest.raises(NotFound):
        inference_key_revoke(actor=actor(fred), key=key)


def test_issuing_and_revoking_enqueue_a_door_sync_of_every_deployment_after_commit(
    alex, legal, deployment, root, tmp_path, django_capture_on_commit_callbacks, door_syncs
):
    other = make_deployment(root, ["http://127.0.0.1:9/"], tmp_path / "other", name="other")
    with mock.patch("serving.tasks.door_access_sync.delay") as delay:
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            key, _ = _issue(alex, legal)
        assert delay.call_count == 0  # nothing before the commit
        for callback in callbacks:
            callback()
        assert sorted(c.args[0] for c in delay.call_args_list) == [deployment.pk, other.pk]

    with door_syncs() as sent:
        inference_key_revoke(actor=actor(alex), key=key)
    assert sorted(sent) == [deployment.pk, other.pk]


def test_deactivating_a_person_revokes_their_keys_in_the_same_transaction(lena, legal, root):
    key, _ = _issue(lena, legal, holder="person")

    user_update(actor=actor(root), user=lena, via="admin", is_active=False)

    key.refresh_from_db()
    assert key.revoked_at is not None and key.revoked_reason == "person deactivated"
    assert AuditEvent.objects.filter(action="inference_key.revoked", object_id=str(key.pk)).exists()


def test_a_person_deactivated_through_scim_leaves_the_door_table(
    root, legal, deployment, settings, door_syncs
):
    settings.OIDC_GROUP_MAP = parse_group_map("legal-team=legal:member")
    _, scim_secret = scim_token_create(actor=actor(root), name="entra")
    scim = Client(HTTP_AUTHORIZATION=f"Bearer {scim_secret}")

    def call(method, path, body):
        response = getattr(scim, method)(
            f"/scim/v2/{path}", json.dumps(body), content_type="application/scim+json"
        )
        assert response.status_code in (200, 201), response.content
        return response.json()

    ada = call(
        "post",
        "Users",
        {
            "schemas": ["urn:ietf:params:scim:schemas:core:2.0:User"],
            "userName": "ada",
            "active": True,
        },
    )
    call(
        "post",
        "Groups",
        {
            "schemas": ["urn:ietf:params:scim:schemas:core:2.0:Group"],
            "displayName": "legal-team",
            "members": [{"value": ada["id"]}],
        },
    )
    person = get_user_model().objects.get(username="ada")
    _, secret = _issue(person, legal, holder="person")
    assert hash_inference_key(secret) in door_access(deployment).keys

    with door_syncs() as sent:
        call(
            "patch",
            f"Users/{ada['id']}",
            {
                "schemas": ["urn:ietf:params:scim:api:messages:2.0:PatchOp"],
                "Operations": [{"op": "replace", "path": "active", "value": False}],
            },
        )

    assert hash_inference_key(secret) not in door_access(deployment).keys
    assert deployment.pk in sent


# -- issue 43: the keys a leaver issued ------------------------------------------


@pytest.fixture
def issued_by_alex(alex, legal):
    """alex (Legal's approver) issued a department key and a pipeline's key."""
    account = service_account_create(actor=actor(alex), department=legal, name="nightly")
    department_key, _ = _issue(alex, legal)
    pipeline_key, _ = inference_key_issue(
        actor=actor(alex),
        department=legal,
        name="nightly",
        expires_in_days=300,
        holder="service_account",
        service_account=account,
    )
    return department_key, pipeline_key


def test_offboarding_lists_the_department_and_pipeline_keys_a_leaver_issued(
    root, alex, issued_by_alex
):
    user_update(actor=actor(root), user=alex, via="admin", is_active=False)

    for key in issued_by_alex:
        key.refresh_from_db()
        assert key.revoked_at is None  # the default keeps them: the department's callers run on
    event = AuditEvent.objects.get(action="user.issued_keys_kept", object_id=str(alex.pk))
    listed = {(k["prefix"], k["department"], k["service_account"]) for k in event.details["keys"]}
    assert listed == {
        (issued_by_alex[0].prefix, "legal", None),
        (issued_by_alex[1].prefix, "legal", "nightly"),
    }
    assert all(len(k["prefix"]) < 20 for k in event.details["keys"])  # never a secret


def test_offboarding_revokes_them_by_the_setting(root, alex, issued_by_alex, settings):
    settings.OFFBOARDING_REVOKE_ISSUED_KEYS = True
    user_update(actor=actor(root), user=alex, via="admin", is_active=False)

    for key in issued_by_alex:
        key.refresh_from_db()
        assert key.revoked_at is not None and key.revoked_reason == "person deactivated"
    assert not AuditEvent.objects.filter(action="user.issued_keys_kept").exists()
    revoked = AuditEvent.objects.filter(action="inference_key.revoked")
    assert {int(e.object_id) for e in revoked} == {k.pk for k in issued_by_alex}


def test_keys_another_person_issued_stay_unlisted(root, alex, lena, legal, issued_by_alex):
    user_update(actor=actor(root), user=lena, via="admin", is_active=False)
    assert not AuditEvent.objects.filter(action="user.issued_keys_kept").exists()
    for key in issued_by_alex:
        key.refresh_from_db()
        assert key.revoked_at is None
