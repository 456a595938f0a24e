"""The outbox: an event is a row written in the transaction of the change it
tells about (from that change's audit event), then fanned out by a worker into
each concerned person's notification and each subscribed webhook's delivery."""

from __future__ import annotations

import logging

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from core.claims import Lease
from core.models import AuditEvent, Department, Membership, Role
from notifications import enqueue
from notifications.events import KINDS, Draft, drafts_for, might_tell, payload
from notifications.models import (
    Channel,
    Delivery,
    EmailStatus,
    Event,
    Notification,
    Preference,
    Webhook,
)

logger = logging.getLogger(__name__)

EVENT_LEASE = Lease(Event, "claimed_by", "claimed_until")
CLAIM_SECONDS = 60.0


def event_record_from_audit(audit: AuditEvent) -> list[Event]:
    """Called inside the change's transaction (core.signals.audit_recorded).

    A fault in reading what the event says (a bug here) is logged and tells
    nobody rather than refusing the approval or rollout that caused it; the
    savepoint keeps the change's transaction usable after a failed query."""
    if not might_tell(audit):
        return []
    try:
        with transaction.atomic():
            drafts = drafts_for(audit)
    except Exception:
        logger.exception("notifications: cannot read %s %s", audit.action, audit.object_id)
        return []
    return [event_record(draft, created_at=audit.created_at) for draft in drafts]


def drift_record(drifts) -> int:
    """Outbox rows of the drift the reconcile found, in its transaction; a
    fault here is logged, never the reconcile's."""
    from notifications.events import DRIFT_TOLD, drift_draft

    recorded = 0
    for drift in drifts:
        if drift.kind not in DRIFT_TOLD:
            continue
        try:
            with transaction.atomic():
                event_record(drift_draft(drift))
        except Exception:
            logger.exception("notifications: cannot record drift %s", drift.kind)
            continue
        recorded += 1
    return recorded


def event_record(draft: Draft, *, created_at=None, dedupe_key: str | None = None) -> Event:
    """The outbox row of `draft`, sent to the fan-out after the commit."""
    department = (
        Department.objects.filter(pk=draft.department_id).first() if draft.department_id else None
    )
    event = Event(
        kind=draft.kind,
        department=department,
        audience=sorted(set(draft.audience)),
        concerns={
            "people": sorted(draft.people),
            "approvers_of": sorted(set(draft.approvers_of)),
            "except": sorted(draft.exclude),
        },
        title=draft.title[:300],
        link=draft.link,
        payload={},
        enqueued_at=timezone.now(),
        dedupe_key=dedupe_key,
    )
    event.payload = payload(
        draft,
        uid=str(event.uid),
        created_at=(created_at or timezone.now()).isoformat(),
        department_slug=department.slug if department else None,
    )
    event.save(force_insert=True)
    enqueue.after_commit("fan_out", [event.pk])
    return event


def events_record_once(drafts: list[tuple[str, Draft]]) -> int:
    """Records each (dedupe key, draft) not recorded before, each in its own
    transaction, for the events no change causes (periodic checks); returns how many."""
    told = set(
        Event.objects.filter(dedupe_key__in=[k for k, _ in drafts]).values_list(
            "dedupe_key", flat=True
        )
    )
    recorded = 0
    for dedupe_key, draft in drafts:
        if dedupe_key in told:
            continue
        try:
            with transaction.atomic():
                event_record(draft, dedupe_key=dedupe_key)
        except IntegrityError:
            continue  # another run recorded it first
        recorded += 1
    return recorded


def recipients(event: Event) -> list[int]:
    """Who is told: the people concerned and the approvers named, then only
    those who can see one of the event's departments (platform admins see all),
    active, and people (a service account's user never reads notifications)."""
    concerns = event.concerns or {}
    wanted = set(concerns.get("people", []))
    approvers_of = concerns.get("approvers_of", [])
    if approvers_of:
        wanted |= set(
            Membership.objects.filter(
                department_id__in=approvers_of, role=Role.APPROVER
            ).values_list("user_id", flat=True)
        )
    if event.department_id is None:
        wanted |= set(get_user_model().objects.filter(is_staff=True).values_list("pk", flat=True))
    wanted -= set(concerns.get("except", []))
    if not wanted:
        return []
    visible = Q(is_staff=True) | Q(memberships__department_id__in=event.audience or [-1])
    return sorted(
        set(
            get_user_model()
            .objects.filter(pk__in=wanted, is_active=True, service_account__isnull=True)
            .filter(visible)
            .values_list("pk", flat=True)
        )
    )


def channel_for(user_id: int, kind: str, chosen: dict[tuple[int, str], str]) -> str:
    """The person's choice for the kind, else the kind's default."""
    known = KINDS.get(kind)
    return chosen.get((user_id, kind)) or (known.default if known else Channel.IN_APP)


def event_fan_out(event_id: int, owner: str) -> bool:
    """Notifications and deliveries of one event, once. Redelivered (a worker
    killed mid-way) it resumes: the rows are unique per person and per webhook,
    and the event is marked done in the transaction that creates them."""
    if not EVENT_LEASE.claim(event_id, owner, CLAIM_SECONDS):
        return False  # another worker has it
    try:
        with transaction.atomic():
            event = Event.objects.select_for_update().filter(pk=event_id).first()
            if event is None or event.fanned_out_at is not None:
                return False
            users = recipients(event)
            chosen = {
                (p.user_id, p.kind): p.channel
                for p in Preference.objects.filter(user_id__in=users, kind=event.kind)
            }
            emails = dict(get_user_model().objects.filter(pk__in=users).values_list("pk", "email"))
            now = timezone.now()
            rows = []
            for user_id in users:
                channel = channel_for(user_id, event.kind, chosen)
                if channel == Channel.OFF:
                    continue
                email = channel == Channel.EMAIL and bool(emails.get(user_id))
                rows.append(
                    Notification(
                        user_id=user_id,
                        event=event,
                        email_status=EmailStatus.PENDING if email else EmailStatus.NONE,
                        next_email_at=now if email else None,
                    )
                )
            Notification.objects.bulk_create(rows, ignore_conflicts=True)
            hooks = [
                w
                for w in Webhook.objects.filter(active=True, department_id__in=event.audience)
                if not w.kinds or event.kind in w.kinds
            ]
            Delivery.objects.bulk_create(
                [Delivery(webhook=w, event=event, next_attempt_at=now) for w in hooks],
                ignore_conflicts=True,
            )
            Event.objects.filter(pk=event.pk).update(fanned_out_at=now)
            enqueue.after_commit(
                "send_email",
                Notification.objects.filter(
                    event=event, email_status=EmailStatus.PENDING
                ).values_list("pk", flat=True),
            )
            enqueue.after_commit(
                "deliver",
                Delivery.objects.filter(event=event, status="pending").values_list("pk", flat=True),
            )
        return True
    finally:
        EVENT_LEASE.release(event_id, owner)
