"""Outbound webhooks: a department's approvers add them; every event of the
department is delivered to each (or the kinds it names), signed, retried with
backoff for about a day, logged attempt by attempt, redelivered on demand,
and the webhook is disabled after repeated failure (its approvers are told).

A delivery is claimed (core.claims) for longer than one attempt can take, and
its outcome is written only while the claim is ours; no row lock is held
across the HTTP call."""

from __future__ import annotations

import json
import logging
import secrets
import time
from datetime import timedelta

import requests
from django.conf import settings
from django.db import transaction
from django.db.models import DateTimeField, F, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from core.access import require_approver, require_platform_admin
from core.actors import Actor
from core.audit import audit_record
from core.backoff import backoff_delay
from core.claims import Lease
from core.errors import Conflict, ValidationFailed
from core.models import Department
from notifications import enqueue
from notifications.addresses import AddressNotAllowed, check_url
from notifications.chat import chat_body
from notifications.events import KINDS
from notifications.models import Delivery, DeliveryAttempt, DeliveryStatus, Webhook
from notifications.signing import HEADER, sign

logger = logging.getLogger(__name__)

DELIVERY_LEASE = Lease(Delivery, "claimed_by", "claimed_until")
# 1 min doubling to 4 h: 13 attempts span about 20 hours.
MAX_ATTEMPTS = 13
BACKOFF_BASE_SECONDS = 60.0
BACKOFF_CAP_SECONDS = 4 * 3600.0
# A webhook is disabled after this many failed attempts in a row (across
# deliveries) that span at least DISABLE_AFTER_SECONDS: a receiver that is
# down for minutes while a backlog is sent fails many attempts quickly, and
# must not lose every event after them; one that is down for half a day is.
DISABLE_AFTER = 30
DISABLE_AFTER_SECONDS = 12 * 3600.0
# A delivered attempt, or a webhook enabled again, ends the failures in a row.
STREAK_CLEARED = {"consecutive_failures": 0, "failing_since": None}
# What is read of a receiver's answer; the rest is never read.
MAX_RESPONSE_BYTES = 64 * 1024
SECRET_PREFIX = "whsec_"  # noqa: S105 - a public marker, not a secret


def clean_kinds(kinds) -> list[str]:
    kinds = sorted(set(kinds or []))
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValidationFailed(
            f"Unknown event kinds: {', '.join(unknown)}. Known: {', '.join(KINDS)}.",
            code="unknown_event_kind",
        )
    return kinds


def webhook_create(
    *,
    actor: Actor,
    department: Department,
    url: str,
    description: str = "",
    kinds=None,
    allow_internal: bool = False,
) -> tuple[Webhook, str]:
    """Returns the webhook and its secret, which is never shown again."""
    require_approver(actor, department.pk, "Department")
    if allow_internal:
        require_platform_admin(actor)
    check_url(url, allow_internal=allow_internal)
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        webhook = Webhook.objects.create(
            department=department,
            url=url,
            description=description,
            secret=secret,
            kinds=clean_kinds(kinds),
            allow_internal=allow_internal,
            created_by=actor.user,
        )
        audit_record(
            actor=actor,
            action="webhook.created",
            obj=webhook,
            department=department,
            details={"url": url, "kinds": webhook.kinds, "allow_internal": allow_internal},
        )
    return webhook, secret


def webhook_update(*, actor: Actor, webhook: Webhook, **changes) -> Webhook:
    """url, description, kinds, active (re-enabling clears the failure count)."""
    require_approver(actor, webhook.department_id, "Webhook")
    if "kinds" in changes:
        changes["kinds"] = clean_kinds(changes["kinds"])
    if "url" in changes:
        check_url(changes["url"], allow_internal=webhook.allow_internal)
    return save_changes(
        actor=actor, hook=webhook, changes=changes, action="webhook.updated", hidden="secret"
    )


def save_changes(
    *, actor: Actor, hook: Webhook, changes: dict, action: str, hidden: str
) -> Webhook:
    """Writes checked `changes` to a webhook or chat channel and records them,
    leaving out the field `hidden` (its secret). Re-enabling clears the
    failure count."""
    if changes.get("active") and not hook.active:
        changes.update(STREAK_CLEARED, disabled_reason="")
    with transaction.atomic():
        for name, value in changes.items():
            setattr(hook, name, value)
        hook.save(update_fields=list(changes) or None)
        audit_record(
            actor=actor,
            action=action,
            obj=hook,
            department=hook.department,
            details={k: v for k, v in changes.items() if k != hidden},
        )
    return hook


def webhook_delete(*, actor: Actor, webhook: Webhook) -> None:
    require_approver(actor, webhook.department_id, "Webhook")
    with transaction.atomic():
        audit_record(
            actor=actor,
            action="webhook.deleted",
            obj=webhook,
            department=webhook.department,
            details={"url": webhook.url},
        )
        webhook.delete()


def delivery_redeliver(*, actor: Actor, delivery: Delivery) -> Delivery:
    """Sends the same event (same id) again, now, whatever its status."""
    require_approver(actor, delivery.webhook.department_id, "Delivery")
    if not delivery.webhook.active:
        raise Conflict(
            "This webhook is disabled; enable it before redelivering.", code="webhook_disabled"
        )
    with transaction.atomic():
        Delivery.objects.filter(pk=delivery.pk).update(
            status=DeliveryStatus.PENDING, next_attempt_at=timezone.now(), attempts=0
        )
        enqueue.after_commit("deliver", [delivery.pk])
    delivery.refresh_from_db()
    return delivery


def delivery_body(delivery: Delivery) -> bytes:
    return json.dumps(delivery.event.payload, separators=(",", ":"), sort_keys=True).encode()


def delivery_attempt(delivery_id: int, owner: str) -> str:
    """One attempt of one due delivery. Returns what happened."""
    claim = settings.NOTIFICATIONS_WEBHOOK_TIMEOUT_SECONDS * 3 + 30
    if not DELIVERY_LEASE.claim(delivery_id, owner, claim):
        return "busy"
    try:
        delivery = (
            Delivery.objects.select_related("webhook", "event").filter(pk=delivery_id).first()
        )
        if delivery is None or delivery.status != DeliveryStatus.PENDING:
            return "done"
        if delivery.next_attempt_at and delivery.next_attempt_at > timezone.now():
            return "not due"
        webhook = delivery.webhook
        if not webhook.active:
            _end(delivery, owner, DeliveryStatus.FAILED, last_error="webhook disabled")
            return "disabled"
        outcome = _post(webhook, delivery)
        DeliveryAttempt.objects.create(delivery=delivery, **outcome.record())
        return _settle(delivery, owner, outcome)
    finally:
        DELIVERY_LEASE.release(delivery_id, owner)


class _Outcome:
    def __init__(
        self, started, duration_ms, status_code=None, error="", transient=False, excerpt=""
    ):
        self.started, self.duration_ms = started, duration_ms
        self.status_code, self.error = status_code, error[:500]
        self.transient, self.excerpt = transient, excerpt[:500]

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300

    def record(self) -> dict:
        return {
            "started_at": self.started,
            "duration_ms": self.duration_ms,
            "status_code": self.status_code,
            "error": self.error,
            "transient": self.transient,
            "response_excerpt": self.excerpt,
        }


# A receiver that is briefly unable (overloaded, deploying, rate limiting) is
# retried; any other 4xx says the request itself is refused, and sending the
# same bytes again would be refused again.
_TRANSIENT_4XX = {408, 409, 425, 429}


def _post(webhook: Webhook, delivery: Delivery) -> _Outcome:
    started = timezone.now()
    clock = time.monotonic()
    timeout = settings.NOTIFICATIONS_WEBHOOK_TIMEOUT_SECONDS

    def took() -> int:
        return int((time.monotonic() - clock) * 1000)

    try:
        # Checked again at each delivery: a name may resolve elsewhere since it was added.
        check_url(webhook.target, allow_internal=webhook.allow_internal)
    except (AddressNotAllowed, ValidationFailed) as error:
        return _Outcome(started, took(), error=error.message)
    if webhook.is_chat:
        # A chat service authenticates by the URL's secret path; it reads no signature.
        body = chat_body(delivery.event)
        headers = {"Content-Type": "application/json", "User-Agent": "lora-registry-webhooks/1"}
    else:
        body = delivery_body(delivery)
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "lora-registry-webhooks/1",
            HEADER: sign(webhook.secret, body),
            "X-LoRA-Registry-Event-Id": str(delivery.event.uid),
            "X-LoRA-Registry-Event-Type": delivery.event.kind,
            "X-LoRA-Registry-Delivery": str(delivery.pk),
        }
    try:
        # No redirects: one could lead inside, and only the webhook's URL was checked.
        with requests.post(
            webhook.target,
            data=body,
            headers=headers,
            timeout=(min(timeout, 5.0), timeout),
            allow_redirects=False,
            stream=True,
        ) as response:
            excerpt = _read_bounded(response, clock + timeout)
            code = response.status_code
    except requests.RequestException as error:
        return _Outcome(started, took(), error=f"{type(error).__name__}", transient=True)
    except TimeoutError:
        return _Outcome(started, took(), error="the answer took too long", transient=True)
    transient = code >= 500 or code in _TRANSIENT_4XX or 300 <= code < 400
    return _Outcome(
        started, took(), status_code=code, transient=transient, excerpt=excerpt, error=""
    )


def _read_bounded(response, deadline: float) -> str:
    """At most MAX_RESPONSE_BYTES, and no later than the deadline: a receiver
    that trickles its answer holds the worker no longer than one that hangs."""
    read = b""
    for chunk in response.iter_content(chunk_size=4096):
        read += chunk
        if len(read) >= MAX_RESPONSE_BYTES:
            break
        if time.monotonic() > deadline:
            raise TimeoutError
    return read[:500].decode("utf-8", "replace")


def _settle(delivery: Delivery, owner: str, outcome: _Outcome) -> str:
    webhook = delivery.webhook
    common = {
        "last_status_code": outcome.status_code,
        "last_duration_ms": outcome.duration_ms,
        "last_error": outcome.error,
        "attempts": delivery.attempts + 1,
    }
    if outcome.ok:
        _end(delivery, owner, DeliveryStatus.DELIVERED, delivered_at=timezone.now(), **common)
        Webhook.objects.filter(pk=webhook.pk).update(**STREAK_CLEARED)
        return "delivered"
    if outcome.transient and delivery.attempts + 1 < MAX_ATTEMPTS:
        delay = backoff_delay(
            delivery.attempts, base=BACKOFF_BASE_SECONDS, cap=BACKOFF_CAP_SECONDS, jitter=True
        )
        Delivery.objects.filter(
            pk=delivery.pk, claimed_by=owner, status=DeliveryStatus.PENDING
        ).update(next_attempt_at=timezone.now() + timedelta(seconds=delay), **common)
        result = "retry"
    else:
        _end(delivery, owner, DeliveryStatus.FAILED, **common)
        result = "failed"
    _count_failure(webhook)
    return result


def _end(delivery: Delivery, owner: str, status: str, **changes) -> None:
    Delivery.objects.filter(pk=delivery.pk, claimed_by=owner, status=DeliveryStatus.PENDING).update(
        status=status, next_attempt_at=None, **changes
    )


def _count_failure(webhook: Webhook) -> None:
    now = timezone.now()
    Webhook.objects.filter(pk=webhook.pk).update(
        consecutive_failures=F("consecutive_failures") + 1,
        failing_since=Coalesce(F("failing_since"), Value(now), output_field=DateTimeField()),
    )
    with transaction.atomic():
        # Compare-and-swap on `active`: two workers failing at once disable it once.
        disabled = Webhook.objects.filter(
            pk=webhook.pk,
            active=True,
            consecutive_failures__gte=DISABLE_AFTER,
            failing_since__lte=now - timedelta(seconds=DISABLE_AFTER_SECONDS),
        ).update(
            active=False,
            disabled_reason=(
                f"{DISABLE_AFTER} failed attempts in a row over "
                f"{DISABLE_AFTER_SECONDS / 3600:g} hours or more"
            ),
        )
        if disabled:
            webhook.refresh_from_db()
            audit_record(
                actor=None,
                action="webhook.disabled",
                obj=webhook,
                department=webhook.department,
                comment=webhook.disabled_reason,
                details={"url": webhook.url},
            )
