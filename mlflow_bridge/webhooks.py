"""MLflow webhooks in: a model version or an alias set in MLflow registers a version
here, for the departments and events a platform admin chose (WebhookRule).

MLflow 3 signs each delivery: `X-MLflow-Signature: v1,<base64 HMAC-SHA256>` of
`<delivery id>.<timestamp>.<body>` with the webhook's secret, beside
`X-MLflow-Delivery-Id` and `X-MLflow-Timestamp` (mlflow/webhooks/delivery.py). A
delivery is accepted only with a valid signature, a timestamp within the tolerance
and a delivery id never accepted before; everything else is refused. Anyone can
send refusals, so they cost the sender, not the log: they are counted per source
and window (WebhookRefusalCount), a source past its allowance is throttled, and
each closed window is audited as counts, one chained event per source.

The request only verifies and records; registering (which downloads the artifact
from MLflow) is a task, enqueued on commit, so MLflow's short delivery timeout
never meets a large download.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from core.actors import Actor
from core.audit import audit_record
from core.errors import ApplicationError, ValidationFailed
from mlflow_bridge.models import (
    DeliveryStatus,
    WebhookDelivery,
    WebhookEvent,
    WebhookRefusalCount,
    WebhookRule,
)
from mlflow_bridge.signals import webhook_accepted

logger = logging.getLogger(__name__)

SIGNATURE_VERSION = "v1"
DELIVERY_ID = re.compile(r"^[A-Za-z0-9-]{1,64}$")
# `runs:/<run id>/<artifact path>`: the source MLflow records for a version logged
# from a run's folder.
RUN_SOURCE = re.compile(r"^runs:/(?P<run>[A-Za-z0-9_-]{1,64})/(?P<path>[^?#]+)$")
# Tags the registry's own mirror puts on what it creates in MLflow (mirror.py):
# versions it mirrors must not come back as new registrations.
MIRROR_TAGS = ("registry_version_id", "managed_by")


class WebhookRefused(ApplicationError):
    status = 401
    code = "webhook_refused"


class WebhookThrottled(ApplicationError):
    status = 429
    code = "webhook_throttled"
    # Set per instance (Retry-After); core.api.errors sends them with the 429.
    headers: dict[str, str]


@dataclass(frozen=True)
class Verified:
    delivery_id: str
    event: str
    payload: dict


def enabled() -> bool:
    return bool(settings.MLFLOW_WEBHOOK_SECRET)


def webhook_throttle(*, client_address: str | None) -> None:
    """Raises WebhookThrottled (429) for a source past its refusals in this window,
    before its body is read or its signature checked. The check is the count: one
    UPDATE, which matches nothing for a source within its allowance."""
    window, source = _window(), client_address or "-"
    if WebhookRefusalCount.objects.filter(
        window_start=window,
        source=source,
        refused__gte=settings.MLFLOW_WEBHOOK_REFUSALS_PER_SOURCE,
    ).update(throttled=F("throttled") + 1):
        seconds = settings.MLFLOW_WEBHOOK_REFUSAL_WINDOW_SECONDS
        wait = max(1, round((window + timedelta(seconds=seconds) - timezone.now()).total_seconds()))
        throttled = WebhookThrottled(
            f"Too many refused deliveries from this address; try again in {wait} s.",
            details={"retry_after_seconds": wait},
        )
        throttled.headers = {"Retry-After": str(wait)}
        raise throttled


def webhook_receive(*, headers, body: bytes, client_address: str | None) -> WebhookDelivery:
    """Verifies one delivery and records it; raises WebhookRefused (and counts
    it) when the signature, the timestamp or the delivery id is wrong."""
    try:
        verified = _verify(headers, body)
    except WebhookRefused as refusal:
        _refuse(refusal, client_address)
        raise
    raw_data = verified.payload.get("data")
    data = raw_data if isinstance(raw_data, dict) else {}
    try:
        with transaction.atomic():
            delivery = WebhookDelivery.objects.create(
                delivery_id=verified.delivery_id,
                status=DeliveryStatus.ACCEPTED,
                event=verified.event[:80],
                model_name=str(data.get("name", ""))[:256],
                model_version=str(data.get("version", ""))[:32],
                alias=str(data.get("alias", ""))[:200],
                payload=verified.payload,
            )
            _enqueue_on_commit(delivery.pk)
    except IntegrityError:
        replay = WebhookRefused(
            f"Delivery {verified.delivery_id} was accepted before: a replay.", code="replayed"
        )
        _refuse(replay, client_address)
        raise replay from None
    return delivery


def _verify(headers, body: bytes) -> Verified:
    delivery_id = headers.get("X-MLflow-Delivery-Id") or ""
    stamp = headers.get("X-MLflow-Timestamp") or ""
    signature = headers.get("X-MLflow-Signature") or ""
    if not DELIVERY_ID.match(delivery_id):
        raise WebhookRefused("X-MLflow-Delivery-Id is missing or malformed.", code="bad_delivery")
    if not stamp.isdigit() or len(stamp) > 12:
        raise WebhookRefused("X-MLflow-Timestamp must be a Unix time.", code="bad_timestamp")
    skew = abs(time.time() - int(stamp))
    if skew > settings.MLFLOW_WEBHOOK_TOLERANCE_SECONDS:
        raise WebhookRefused(
            f"X-MLflow-Timestamp is {skew:.0f} s away from now (at most "
            f"{settings.MLFLOW_WEBHOOK_TOLERANCE_SECONDS} s): too old to trust.",
            code="stale_timestamp",
        )
    version, _, sent = signature.partition(",")
    signed = f"{delivery_id}.{stamp}.".encode() + body
    expected = base64.b64encode(
        hmac.new(settings.MLFLOW_WEBHOOK_SECRET.encode(), signed, hashlib.sha256).digest()
    ).decode()
    if version != SIGNATURE_VERSION or not hmac.compare_digest(sent.encode(), expected.encode()):
        raise WebhookRefused(
            "X-MLflow-Signature does not match the body signed with the webhook secret.",
            code="bad_signature",
        )
    try:
        payload = json.loads(body)
    except ValueError:
        raise WebhookRefused("The body is not JSON.", code="bad_body") from None
    if not isinstance(payload, dict):
        raise WebhookRefused("The body is not a JSON object.", code="bad_body")
    event = f"{payload.get('entity', '')}.{payload.get('action', '')}"
    return Verified(delivery_id=delivery_id, event=event, payload=payload)


def _window(now: datetime | None = None) -> datetime:
    """The start of the refusal window `now` falls in (windows align to the epoch)."""
    seconds = settings.MLFLOW_WEBHOOK_REFUSAL_WINDOW_SECONDS
    epoch = int((now or timezone.now()).timestamp())
    return datetime.fromtimestamp(epoch - epoch % seconds, tz=UTC)


def _refuse(refusal: WebhookRefused, client_address: str | None) -> None:
    """Counts the refusal for its source and window: no row and no audit event of
    its own, so a flood of forged deliveries never takes the audit chain's lock."""
    window, source = _window(), client_address or "-"
    with transaction.atomic():
        count, created = WebhookRefusalCount.objects.select_for_update(no_key=True).get_or_create(
            window_start=window, source=source
        )
        count.refused += 1
        count.codes[refusal.code] = count.codes.get(refusal.code, 0) + 1
        count.save(update_fields=["refused", "codes"])
    if created:  # once per source and window, not once per forged delivery
        logger.warning(
            "MLflow webhook refused from %s: %s (more from there in this window are counted)",
            source,
            refusal.code,
        )


def webhook_refusals_audit(*, batch: int = 200) -> int:
    """Writes one chained audit event for each source's refusals in a closed window,
    once: a compare-and-swap on `audited_at` in the event's transaction, so two
    runs never both write it. A window counts as closed one window after its end,
    so that a refusal counted at its last moment is not missed. Returns how many."""
    seconds = settings.MLFLOW_WEBHOOK_REFUSAL_WINDOW_SECONDS
    closed_before = _window() - timedelta(seconds=seconds)
    due = WebhookRefusalCount.objects.filter(audited_at=None, window_start__lt=closed_before)
    written = 0
    for pk in due.order_by("window_start", "pk").values_list("pk", flat=True)[:batch]:
        with transaction.atomic():
            if not WebhookRefusalCount.objects.filter(pk=pk, audited_at=None).update(
                audited_at=timezone.now()
            ):
                continue  # another run wrote it
            count = WebhookRefusalCount.objects.get(pk=pk)
            audit_record(
                actor=None,
                action="mlflow.webhook_refusals",
                obj=count,
                department=None,
                comment=(
                    f"{count.refused} webhook deliveries refused from {count.source}, "
                    f"{count.throttled} more throttled, in {seconds} s"
                ),
                details={
                    "source": count.source,
                    "window_start": count.window_start.isoformat(),
                    "window_seconds": seconds,
                    "refused": count.refused,
                    "throttled": count.throttled,
                    "codes": count.codes,
                },
            )
        written += 1
    return written


def _enqueue_on_commit(pk: int) -> None:
    # The receiver (mlflow_bridge.receivers.send_webhook) sends the task.
    transaction.on_commit(lambda: webhook_accepted.send(sender=None, delivery_id=pk))


# -- rules (platform admins) ------------------------------------------------------

RULE_FIELDS = ("event", "alias", "artifact_path", "submit", "enabled")


def webhook_rule_save(*, actor: Actor, rule: WebhookRule | None = None, **values) -> WebhookRule:
    """Creates (rule=None; `department` in values) or changes a rule, audited."""
    from core.access import require_platform_admin

    require_platform_admin(actor)
    with transaction.atomic():
        if rule is None:
            rule = WebhookRule(created_by=actor.user, department=values.pop("department"))
            action = "mlflow.webhook_rule_create"
        else:
            rule = WebhookRule.objects.select_for_update(no_key=True).get(pk=rule.pk)
            action = "mlflow.webhook_rule_update"
        for name in RULE_FIELDS:
            if name in values:
                setattr(rule, name, values[name])
        if rule.event != WebhookEvent.ALIAS_CREATED:
            rule.alias = ""
        try:
            rule.full_clean()
        except DjangoValidationError as error:
            raise ValidationFailed(
                " ".join(error.messages), code="bad_webhook_rule", details=error.message_dict
            ) from None
        rule.save()
        audit_record(
            actor=actor,
            action=action,
            obj=rule,
            department=rule.department,
            details={name: getattr(rule, name) for name in RULE_FIELDS},
        )
    return rule


def webhook_rule_delete(*, actor: Actor, rule: WebhookRule) -> None:
    from core.access import require_platform_admin

    require_platform_admin(actor)
    with transaction.atomic():
        audit_record(
            actor=actor,
            action="mlflow.webhook_rule_delete",
            obj=rule,
            department=rule.department,
            details={name: getattr(rule, name) for name in RULE_FIELDS},
        )
        rule.delete()


# -- the worker's side -------------------------------------------------------------


def webhook_handle(*, delivery_id: int) -> str:
    """Acts on an accepted delivery once: registers (and maybe submits) the version the
    event names, or records why not. Idempotent: a delivery handled is not redone, and
    a run registered before returns its version (register_from_run)."""
    from mlflow_bridge import client as mlc
    from mlflow_bridge.client import MlflowCallError
    from mlflow_bridge.lineage import register_from_run
    from registry.models import Adapter
    from registry.services.versions import version_transition

    delivery = WebhookDelivery.objects.filter(pk=delivery_id).first()
    if delivery is None or delivery.status != DeliveryStatus.ACCEPTED:
        return "done before"
    if delivery.event not in WebhookEvent.values:
        return _finish(delivery, DeliveryStatus.IGNORED, f"event {delivery.event} is not acted on")
    department_slug, _, adapter_name = delivery.model_name.partition(".")
    adapter = (
        Adapter.objects.select_related("department")
        .filter(department__slug=department_slug, name=adapter_name)
        .first()
    )
    if adapter is None:
        return _finish(
            delivery, DeliveryStatus.IGNORED, f"no adapter is named {delivery.model_name!r}"
        )
    rule = WebhookRule.objects.filter(
        department=adapter.department,
        event=delivery.event,
        alias=delivery.alias if delivery.event == WebhookEvent.ALIAS_CREATED else "",
        enabled=True,
    ).first()
    if rule is None:
        return _finish(
            delivery, DeliveryStatus.IGNORED, f"no rule of {adapter.department.slug} for this event"
        )
    delivery.rule = rule
    data = delivery.payload.get("data") or {}
    tags: dict[str, str] | None
    try:
        if delivery.event == WebhookEvent.ALIAS_CREATED:
            # The alias event names only the version: ask MLflow for its run.
            found = mlc.get_client().get_model_version(delivery.model_name, delivery.model_version)
            source, run_id, tags = found.source, found.run_id, dict(found.tags or {})
        else:
            source, run_id, tags = data.get("source", ""), data.get("run_id"), data.get("tags")
    except MlflowCallError as error:
        if error.transient:
            raise
        return _finish(delivery, DeliveryStatus.FAILED, error.message)
    except Exception as error:  # the MLflow client raises its own exception types
        translated = mlc.translate(error)
        if translated.transient:
            raise translated from error
        return _finish(delivery, DeliveryStatus.FAILED, translated.message)
    if any(tag in (tags or {}) for tag in MIRROR_TAGS):
        return _finish(delivery, DeliveryStatus.IGNORED, "the registry's own mirrored version")
    if not run_id:
        return _finish(delivery, DeliveryStatus.FAILED, "the model version names no run")
    match = RUN_SOURCE.match(source or "")
    artifact_path = match["path"] if match and match["run"] == run_id else rule.artifact_path
    actor = _rule_actor(rule, delivery)
    try:
        result = register_from_run(
            actor=actor, adapter=adapter, run_id=run_id, artifact_path=artifact_path
        )
        version = result.version
        if rule.submit and result.created:
            version = version_transition(actor=actor, version=version, action="submit")
    except ApplicationError as error:
        if error.status == 503:
            raise
        return _finish(delivery, DeliveryStatus.FAILED, f"{error.code}: {error.message}")
    delivery.version = version
    return _finish(
        delivery,
        DeliveryStatus.REGISTERED,
        f"version {version.number} ({version.status})"
        + ("" if result.created else ", registered before from this run"),
    )


def webhook_stale(*, older_than_seconds: float = 300) -> list[int]:
    """Accepted deliveries nobody finished: an enqueue lost at commit, or a task
    that gave up while MLflow was down. The catch-up task sends them again
    (handling is idempotent)."""
    cutoff = timezone.now() - timedelta(seconds=older_than_seconds)
    stale = list(
        WebhookDelivery.objects.filter(
            status=DeliveryStatus.ACCEPTED, received_at__lt=cutoff
        ).values_list("pk", flat=True)[:100]
    )
    return stale


def _rule_actor(rule: WebhookRule, delivery: WebhookDelivery) -> Actor:
    """The registration is made in the name of the admin who set the rule, so the
    audit trail says who allowed it; it never approves (four-eyes holds: that admin
    registered, so another person must approve)."""
    user = get_user_model().objects.get(pk=rule.created_by_id)
    return Actor(user=user, request_id=f"mlflow-webhook-{delivery.delivery_id}")


def _finish(delivery: WebhookDelivery, status: str, detail: str) -> str:
    delivery.status = status
    delivery.detail = detail[:2000]
    delivery.finished_at = timezone.now()
    delivery.save(update_fields=["status", "detail", "finished_at", "rule", "version"])
    return status
