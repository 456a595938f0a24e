"""Writes audit events. Call it inside the transaction of the change it records,
so that a change and its record commit or roll back together."""

from __future__ import annotations

import json

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models, transaction
from django.utils import timezone

from core.actors import Actor
from core.audit_chain import chain_head, event_hash, lock_chain
from core.models import AuditEvent, Department
from core.signals import audit_recorded


def audit_record(
    *,
    actor: Actor | None,
    action: str,
    obj: models.Model,
    department: Department | None,
    from_state: str = "",
    to_state: str = "",
    comment: str = "",
    details: dict | None = None,
) -> AuditEvent:
    event = audit_event(
        actor=actor,
        action=action,
        obj=obj,
        department=department,
        from_state=from_state,
        to_state=to_state,
        comment=comment,
        details=details,
    )
    audit_record_all([event])
    return event


def audit_record_all(events: list[AuditEvent]) -> None:
    """Chains and saves `events` (from audit_event), in order, under one lock of
    the chain and one read of its head: a change that records two events (a
    promotion and its rollout) pays for the chain once."""
    with transaction.atomic():
        # Receivers first: the chain's lock is global and held until the commit,
        # so what they read and write (the notifications outbox) must not make
        # every other audited change wait. Same transaction all the same.
        for event in events:
            audit_recorded.send(sender=AuditEvent, event=event)
        lock_chain()
        head = chain_head()
        for event in events:
            event.prev_hash = head
            event.hash = head = event_hash(event)
            event.save(force_insert=True)


def audit_event(
    *,
    actor: Actor | None,
    action: str,
    obj: models.Model,
    department: Department | None,
    from_state: str = "",
    to_state: str = "",
    comment: str = "",
    details: dict | None = None,
) -> AuditEvent:
    """The event audit_record would save, not yet chained nor saved."""
    details = dict(details or {})
    token = actor.token if actor else None
    account = token.service_account if token else None
    if token is not None and account is not None:
        # Every use names the account, who created it, and who minted the token.
        details.setdefault(
            "service_account",
            {
                "id": account.pk,
                "name": str(account),
                "created_by": account.created_by.get_username(),
                "token_created_by": token.created_by.get_username(),
            },
        )
    event = AuditEvent(
        created_at=timezone.now(),
        actor=actor.user if actor else None,
        actor_token=actor.token if actor else None,
        actor_label=actor.label if actor else "system",
        action=action,
        department=department,
        object_type=obj._meta.label_lower,
        object_id=str(obj.pk),
        object_repr=str(obj)[:300],
        from_state=from_state,
        to_state=to_state,
        comment=comment,
        request_id=actor.request_id if actor else "",
        client_address=actor.client_address if actor else None,
        details=details,
    )
    # What the database will hand back, so that the hash verifies after a round trip.
    address = AuditEvent._meta.get_field("client_address")
    event.client_address = address.get_prep_value(event.client_address)
    event.details = json.loads(json.dumps(event.details, cls=DjangoJSONEncoder))
    return event
