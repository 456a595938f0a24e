"""Races on PostgreSQL between a service account's deactivation and a token
minted for it at the same moment (found by the contract tier's two workers:
a deadlock, answered 500).

Django's foreign keys are checked at COMMIT. A mint held the audit chain's lock
(taken at its audit record) while its commit checked the new token's account,
which the deactivation held FOR UPDATE while it waited for the chain."""

from __future__ import annotations

import threading

import pytest
from django.db import transaction

from core.errors import Conflict
from core.models import ApiToken
from core.services import service_accounts
from core.services.service_accounts import (
    service_account_create,
    service_account_deactivate,
    service_account_token_create,
)
from tests.conftest import actor, requires_postgres
from tests.support.races import Racers

pytestmark = [
    pytest.mark.postgres,
    requires_postgres(),
    pytest.mark.django_db(transaction=True),
]


def test_a_mint_and_a_deactivation_at_once_both_end_and_no_token_outlives_the_account(
    monkeypatch, alex, legal
):
    account = service_account_create(actor=actor(alex), department=legal, name="nightly")
    minted_and_audited = threading.Event()
    account_locked = threading.Event()

    # The deactivation reaches its audit record holding the account's row: it
    # says so, then waits for the chain as before.
    real_audit = service_accounts.audit_record

    def audit_once_locked(**kwargs):
        account_locked.set()
        return real_audit(**kwargs)

    monkeypatch.setattr(service_accounts, "audit_record", audit_once_locked)

    def mint():
        with transaction.atomic():
            token, _ = service_account_token_create(
                actor=actor(alex), account=account, name="late", abilities=["audit:read"]
            )
            minted_and_audited.set()  # holds the audit chain until it commits
            # Commits once the deactivation holds the account (the deadlock's
            # order), or after 3 s if the deactivation waits for this mint.
            account_locked.wait(timeout=3)
        return token.pk

    def deactivate():
        minted_and_audited.wait(timeout=30)
        service_account_deactivate(actor=actor(alex), account=account)
        return "deactivated"

    outcomes = Racers(mint=mint, deactivate=deactivate).outcomes()

    assert outcomes["deactivate"] == "deactivated", outcomes
    assert isinstance(outcomes["mint"], int), outcomes
    # The token minted first was ended with its account.
    assert ApiToken.objects.get(pk=outcomes["mint"]).revoked_at is not None


def test_a_mint_after_the_deactivation_is_refused(alex, legal):
    account = service_account_create(actor=actor(alex), department=legal, name="nightly")
    stale = type(account).objects.get(pk=account.pk)  # read before it ended
    service_account_deactivate(actor=actor(alex), account=account)
    with pytest.raises(Conflict, match="deactivated"):
        service_account_token_create(
            actor=actor(alex), account=stale, name="late", abilities=["audit:read"]
        )
    assert not ApiToken.objects.filter(service_account=account).exists()
