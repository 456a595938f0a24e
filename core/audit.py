"""Writes audit events. Call it inside the transaction of the change it records,
so that a change and its record commit or roll back together."""

from __future__ import annotations

from django.db import models

from core.actors import Actor
from core.models import AuditEvent, Department


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
    return AuditEvent.objects.create(
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
        details=details or {},
    )
