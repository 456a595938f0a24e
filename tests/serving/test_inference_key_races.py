"""Races on PostgreSQL between ending a service account (which ends its
inference keys) and revoking one of its keys at the same moment: both end,
without a deadlock, whichever holds the key's row first (rows are locked
before the audit chain, docs/internals/architecture.md)."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from core.models import AuditEvent
from core.services.service_accounts import service_account_create, service_account_deactivate
from serving.models import InferenceKey
from serving.services import inference_keys
from serving.services.inference_keys import inference_key_issue, inference_key_revoke
from tests.conftest import actor, requires_postgres
from tests.support.races import Racers

pytestmark = [
    pytest.mark.postgres,
    requires_postgres(),
    pytest.mark.django_db(transaction=True),
]


def someone_waits_for_a_lock(seconds: float = 30) -> bool:
    """True once another session of this database waits for a lock."""
    deadline = time.monotonic() + seconds
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
            )
            if cursor.fetchone()[0]:
                return True
            time.sleep(0.05)
    return False


def test_ending_an_account_while_one_of_its_keys_is_revoked_ends_both(monkeypatch, alex, legal):
    account = service_account_create(actor=actor(alex), department=legal, name="nightly")
    key, _ = inference_key_issue(
        actor=actor(alex),
        department=legal,
        name="batch",
        expires_in_days=30,
        holder="service_account",
        service_account=account,
    )
    key_row_held = threading.Event()
    go_on = threading.Event()

    # The revoke holds the key's row (its UPDATE), then waits before its audit
    # record until the deactivation is seen waiting for a lock.
    real_audit = inference_keys.audit_record

    def audit_when_told(**kwargs):
        key_row_held.set()
        go_on.wait(timeout=30)
        return real_audit(**kwargs)

    monkeypatch.setattr(inference_keys, "audit_record", audit_when_told)

    def revoke():
        inference_key_revoke(actor=actor(alex), key=key, reason="rotated")
        return "revoked"

    def deactivate():
        key_row_held.wait(timeout=30)
        service_account_deactivate(actor=actor(alex), account=account)
        return "deactivated"

    racers = Racers(revoke=revoke, deactivate=deactivate)
    assert key_row_held.wait(timeout=30)
    # Before: the deactivation took the chain, then waited for the key's row.
    assert someone_waits_for_a_lock(), "the deactivation never waited"
    go_on.set()

    assert racers.outcomes() == {"revoke": "revoked", "deactivate": "deactivated"}
    assert InferenceKey.objects.get(pk=key.pk).revoked_reason == "rotated"
    # One revocation recorded: the deactivation found the key already ended.
    assert AuditEvent.objects.filter(action="inference_key.revoked").count() == 1
