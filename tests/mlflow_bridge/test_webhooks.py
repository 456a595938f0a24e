"""MLflow webhooks in (mlflow_bridge/webhooks.py): signed deliveries only, no
replays, refusals counted and throttled per source (not a row and a chained
audit event each), and a real `mlflow server` (SQL backend) delivering real
webhooks that register a version for the departments and events an admin chose."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import uuid
from collections import Counter
from datetime import timedelta

import pytest

import core.audit
from core.audit_chain import verify_chain
from core.models import AuditEvent
from mlflow_bridge.models import DeliveryStatus, WebhookDelivery, WebhookEvent, WebhookRefusalCount
from mlflow_bridge.tasks import catch_up
from mlflow_bridge.webhooks import webhook_rule_save
from registry.models import AdapterVersion
from tests.conftest import actor
from tests.mlflow_bridge.conftest import log_run

SECRET = "whsec-test-0123456789"
URL = "/api/v1/mlflow/webhooks/"


@pytest.fixture
def webhooks_on(settings):
    settings.MLFLOW_WEBHOOK_SECRET = SECRET


def _signed(body: dict, *, secret: str = SECRET, delivery: str | None = None, at=None):
    payload = json.dumps(body)
    delivery = delivery or str(uuid.uuid4())
    stamp = str(int(at if at is not None else time.time()))
    mac = hmac.new(secret.encode(), f"{delivery}.{stamp}.{payload}".encode(), hashlib.sha256)
    headers = {
        "HTTP_X_MLFLOW_DELIVERY_ID": delivery,
        "HTTP_X_MLFLOW_TIMESTAMP": stamp,
        "HTTP_X_MLFLOW_SIGNATURE": "v1," + base64.b64encode(mac.digest()).decode(),
    }
    return payload, headers


EVENT = {
    "entity": "model_version",
    "action": "created",
    "timestamp": "2026-12-01T00:00:00Z",
    "data": {"name": "legal.nothing-here", "version": "1", "source": "runs:/abc/adapter",
             "run_id": "abc", "tags": {}, "description": None},
}  # fmt: skip


def _post(client, payload: str, headers: dict):
    return client.post(URL, data=payload, content_type="application/json", **headers)


def _refusals() -> dict[str, int]:
    """Refusals counted, by reason, over every source and window."""
    found = Counter()
    for count in WebhookRefusalCount.objects.all():
        found.update(count.codes)
    return dict(found)


@pytest.mark.django_db
def test_webhooks_are_off_without_a_secret(anonymous, settings):
    settings.MLFLOW_WEBHOOK_SECRET = ""
    assert _post(anonymous, *_signed(EVENT)).status_code == 404


@pytest.mark.django_db
def test_a_signed_delivery_is_accepted_once_and_a_replay_is_refused_and_counted(
    anonymous, webhooks_on, settings
):
    settings.CELERY_TASK_ALWAYS_EAGER = False  # only the request's side here
    payload, headers = _signed(EVENT)
    first = _post(anonymous, payload, headers)
    assert first.status_code == 202, first.content
    delivery = WebhookDelivery.objects.get(pk=first.json()["delivery"])
    assert (
        delivery.status == DeliveryStatus.ACCEPTED and delivery.model_name == "legal.nothing-here"
    )

    again = _post(anonymous, payload, headers)
    assert again.status_code == 401 and again.json()["error"]["code"] == "replayed"
    assert _refusals() == {"replayed": 1}
    assert WebhookDelivery.objects.filter(status=DeliveryStatus.ACCEPTED).count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("forge", "code"),
    [
        (lambda body: _signed(body, secret="not-the-secret"), "bad_signature"),
        (lambda body: _signed(body, at=time.time() - 3600), "stale_timestamp"),
        (lambda body: _signed(body, at=time.time() + 3600), "stale_timestamp"),
        (lambda body: (json.dumps({**body, "action": "deleted"}), _signed(body)[1]),
         "bad_signature"),
        (lambda body: (_signed(body)[0], {**_signed(body)[1], "HTTP_X_MLFLOW_SIGNATURE": "v2,x"}),
         "bad_signature"),
        (lambda body: (_signed(body)[0], {**_signed(body)[1], "HTTP_X_MLFLOW_DELIVERY_ID": "a/b"}),
         "bad_delivery"),
    ],
    ids=["wrong-secret", "old", "future", "body-changed", "other-scheme", "bad-id"],
)  # fmt: skip
def test_forged_deliveries_are_refused_and_counted(anonymous, webhooks_on, forge, code):
    response = _post(anonymous, *forge(EVENT))
    assert response.status_code == 401
    assert response.json()["error"]["code"] == code
    assert _refusals() == {code: 1}
    assert not WebhookDelivery.objects.exists()


FORGED = "203.0.113.9"


@pytest.fixture
def flood_settings(settings, webhooks_on):
    settings.MLFLOW_WEBHOOK_REFUSALS_PER_SOURCE = 10
    # Windows align to the epoch: one this long is crossed by a 20 s test once in 50,000 runs.
    settings.MLFLOW_WEBHOOK_REFUSAL_WINDOW_SECONDS = 1_000_000
    return settings


def _forge(client, address=FORGED):
    payload, headers = _signed(EVENT, secret="not-the-secret")
    return _post(client, payload, {**headers, "REMOTE_ADDR": address})


@pytest.mark.django_db
def test_a_thousand_forged_deliveries_are_one_count_and_never_take_the_chain_lock(
    anonymous, flood_settings, monkeypatch
):
    locks, lock_chain = [], core.audit.lock_chain
    monkeypatch.setattr(core.audit, "lock_chain", lambda: (locks.append(1), lock_chain())[1])
    answers = [_forge(anonymous) for _ in range(1000)]

    assert Counter(a.status_code for a in answers) == {401: 10, 429: 990}
    throttled = answers[-1]
    assert throttled.json()["error"]["code"] == "webhook_throttled"
    assert 1 <= int(throttled["Retry-After"]) <= 1_000_000
    assert locks == []
    assert not WebhookDelivery.objects.exists()
    assert not AuditEvent.objects.filter(action__startswith="mlflow.webhook").exists()
    count = WebhookRefusalCount.objects.get()
    assert (count.source, count.refused, count.throttled) == (FORGED, 10, 990)
    assert count.codes == {"bad_signature": 10}


@pytest.mark.django_db
def test_a_throttled_source_does_not_hold_up_deliveries_from_another(anonymous, flood_settings):
    flood_settings.CELERY_TASK_ALWAYS_EAGER = False  # only the request's side here
    assert [_forge(anonymous).status_code for _ in range(11)][-2:] == [401, 429]
    payload, headers = _signed(EVENT)
    accepted = _post(anonymous, payload, {**headers, "REMOTE_ADDR": "198.51.100.7"})
    assert accepted.status_code == 202, accepted.content


@pytest.mark.django_db
def test_each_closed_window_is_audited_once_as_counts(anonymous, flood_settings):
    for _ in range(15):
        _forge(anonymous)
    _forge(anonymous, address="198.51.100.7")
    catch_up()  # the beat task: the window is still open
    assert not AuditEvent.objects.filter(action="mlflow.webhook_refusals").exists()

    window = timedelta(seconds=flood_settings.MLFLOW_WEBHOOK_REFUSAL_WINDOW_SECONDS)
    for count in WebhookRefusalCount.objects.all():
        WebhookRefusalCount.objects.filter(pk=count.pk).update(
            window_start=count.window_start - 2 * window
        )
    catch_up()
    catch_up()

    events = {
        e.details["source"]: e.details
        for e in AuditEvent.objects.filter(action="mlflow.webhook_refusals")
    }
    assert len(events) == 2 and AuditEvent.objects.count() == 2
    assert (events[FORGED]["refused"], events[FORGED]["throttled"]) == (10, 5)
    assert events[FORGED]["codes"] == {"bad_signature": 10}
    assert (events["198.51.100.7"]["refused"], events["198.51.100.7"]["throttled"]) == (1, 0)
    assert verify_chain().ok


@pytest.mark.django_db
def test_a_body_over_the_limit_is_refused_before_it_is_read(anonymous, webhooks_on, settings):
    settings.MLFLOW_WEBHOOK_MAX_BYTES = 1024
    payload, headers = _signed({**EVENT, "padding": "x" * 2000})
    assert _post(anonymous, payload, headers).status_code == 413
    assert not WebhookDelivery.objects.exists()


@pytest.mark.django_db
def test_an_alias_rule_must_name_its_alias(root, legal):
    from core.errors import ValidationFailed

    with pytest.raises(ValidationFailed):
        webhook_rule_save(actor=actor(root), department=legal, event=WebhookEvent.ALIAS_CREATED)


# -- a real MLflow server delivering -------------------------------------------------


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def mlflow_webhook(tracking, live_server, webhooks_on):
    from mlflow.entities.webhook import WebhookEvent as MlflowEvent

    hook = tracking.create_webhook(
        name=f"registry-{uuid.uuid4().hex[:8]}",
        url=f"{live_server.url}{URL}",
        events=[
            MlflowEvent("model_version", "created"),
            MlflowEvent("model_version_alias", "created"),
        ],
        secret=SECRET,
    )  # fmt: skip
    yield hook
    tracking.delete_webhook(hook.webhook_id)


@pytest.mark.mlflow
@pytest.mark.django_db(transaction=True)
def test_real_mlflow_webhooks_register_submit_and_never_echo_the_mirror(
    mlflow_on, tracking, mlflow_webhook, adapter, root, tmp_path
):
    webhook_rule_save(actor=actor(root), department=adapter.department,
                      event=WebhookEvent.VERSION_CREATED, submit=True)  # fmt: skip
    name = f"{adapter.department.slug}.{adapter.name}"
    run_id = log_run(tracking, tmp_path)
    tracking.create_registered_model(name)
    tracking.create_model_version(name, source=f"runs:/{run_id}/adapter", run_id=run_id)

    # The delivery is finished once the version is registered AND submitted.
    delivery = _wait_for(
        lambda: WebhookDelivery.objects.filter(model_name=name, event="model_version.created")
        .exclude(status__in=[DeliveryStatus.ACCEPTED, DeliveryStatus.IGNORED])
        .first(),
        60, "the webhook to register the run",
    )  # fmt: skip
    assert delivery.status == DeliveryStatus.REGISTERED, delivery.detail
    assert delivery.version.mlflow_run_id == run_id
    assert delivery.version.status == "pending_review"  # the rule also submits
    # The registry's mirror pushed that version back into MLflow; its own webhook
    # delivery is recognised and ignored, not registered a second time.
    echo = _wait_for(
        lambda: WebhookDelivery.objects.filter(
            status=DeliveryStatus.IGNORED, detail__contains="mirrored"
        ).first(),
        60, "the mirror's own delivery",
    )  # fmt: skip
    assert echo.model_name == name
    assert AdapterVersion.objects.filter(adapter=adapter).count() == 1


@pytest.mark.mlflow
@pytest.mark.django_db(transaction=True)
def test_a_real_alias_event_registers_only_for_the_alias_a_rule_names(
    mlflow_on, tracking, mlflow_webhook, adapter, root, tmp_path
):
    webhook_rule_save(actor=actor(root), department=adapter.department,
                      event=WebhookEvent.ALIAS_CREATED, alias="candidate")  # fmt: skip
    name = f"{adapter.department.slug}.{adapter.name}"
    tracking.create_registered_model(name)
    other_run, candidate_run = log_run(tracking, tmp_path), log_run(tracking, tmp_path)
    for run_id in (other_run, candidate_run):
        tracking.create_model_version(name, source=f"runs:/{run_id}/adapter", run_id=run_id)
    # Version creation has no rule here: ignored. Only the alias "candidate" registers.
    tracking.set_registered_model_alias(name, "staging", "1")
    tracking.set_registered_model_alias(name, "candidate", "2")

    delivery = _wait_for(
        lambda: WebhookDelivery.objects.filter(alias="candidate")
        .exclude(status=DeliveryStatus.ACCEPTED)
        .first(),
        60, "the alias to register run 2",
    )  # fmt: skip
    assert delivery.status == DeliveryStatus.REGISTERED, delivery.detail
    assert delivery.version.mlflow_run_id == candidate_run
    assert delivery.version.status == "registered"
    _wait_for(
        lambda: WebhookDelivery.objects.filter(alias="staging").exclude(
            status=DeliveryStatus.ACCEPTED
        ).first(),
        30, "the staging alias' delivery to be handled",
    )  # fmt: skip
    assert not AdapterVersion.objects.filter(adapter=adapter, mlflow_run_id=other_run).exists()
    assert WebhookDelivery.objects.get(alias="staging").status == DeliveryStatus.IGNORED
