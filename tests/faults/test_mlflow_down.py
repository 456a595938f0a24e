"""5. MLflow goes down (the real server, stopped) during registration from a
run, and during a mirror push. Registration answers 503 and writes nothing;
the mirror row converges once MLflow is back, through the catch-up beat task
(the push's own retries are switched off, so only the beat can repair it)."""

from __future__ import annotations

import uuid

import pytest
from django.conf import settings

from core.models import AuditEvent
from registry.models import AdapterVersion
from tests.faults.conftest import wait_for
from tests.mlflow_bridge.conftest import TrainingRun, log_run
from tests.serving.vllm.conftest import ok
from tests.support.adapters import AdapterSpec

pytestmark = pytest.mark.django_db(transaction=True)


def test_mlflow_down_during_registration_and_during_a_mirror_push(
    stack, platform, mlflow_up, measure, tmp_path
):
    from mlflow import MlflowClient

    registration = measure("5a. MLflow down during registration from a run (503)", 60)
    mirror = measure("5b. MLflow down during a mirror push (catch-up beat)", 60)
    stack.use_broker("redis")
    stack.start_worker()
    stack.start_beat()
    tracking = MlflowClient(tracking_uri=mlflow_up.url, registry_uri=mlflow_up.url)
    # The MLflow server outlives each test's database: names of this test's own.
    adapter_id = platform.adapter(f"contracts-{uuid.uuid4().hex[:6]}", "legal-contracts")
    url = f"/api/v1/adapters/{adapter_id}/versions/from-mlflow-run/"
    # Different weights: the registry refuses a second version with the same content.
    first_run = log_run(tracking, tmp_path, TrainingRun(spec=AdapterSpec(seed=51)))
    second_run = log_run(tracking, tmp_path, TrainingRun(spec=AdapterSpec(seed=52)))
    first = ok(
        platform.member.post(url, {"run_id": first_run, "artifact_path": "adapter"}, "json"), 201
    )

    def mirror_state(version_id: int):
        row = AdapterVersion.objects.select_related("mlflow_mirror").get(pk=version_id)
        return row.mlflow_mirror.state, row.mlflow_mirror.synced_status

    assert registration.converge(
        lambda: mirror_state(first["id"]) == ("synced", "registered"), timeout=60
    ), "the first version never reached MLflow"

    mlflow_up.stop()
    try:
        refused = platform.member.post(
            url, {"run_id": second_run, "artifact_path": "adapter"}, format="json"
        )
        assert refused.status_code == 503, (refused.status_code, refused.content[:500])
        error = refused.json()["error"]
        registration.notes["error"] = error["message"]
        assert error["code"] == "mlflow_unavailable" and "MLflow" in error["message"]
        assert AdapterVersion.objects.count() == 1, "a version was written while MLflow was down"
        assert list(settings.INGEST_STAGING_DIR.iterdir()) == []

        ok(platform.member.post(f"/api/v1/versions/{first['id']}/submit/"))
        # The push is attempted and refused while MLflow is away.
        assert mirror.converge(
            lambda: (
                mirror_state(first["id"])[0] in ("pending", "failed")
                and AdapterVersion.objects.get(pk=first["id"]).mlflow_mirror.attempts >= 1
            ),
            timeout=30,
        ), "the mirror push was never attempted"
    finally:
        mlflow_up.start()
    registration.fault_ended()
    mirror.fault_ended()

    second = {}

    def registered() -> bool:
        again = platform.member.post(
            url, {"run_id": second_run, "artifact_path": "adapter"}, format="json"
        )
        second.update(again.json() if again.status_code == 201 else {})
        return again.status_code == 201

    registration.converge(registered)
    mirror.converge(lambda: mirror_state(first["id"]) == ("synced", "pending_review"))
    # The version registered after the outage reaches MLflow too.
    new_mirror = wait_for(
        lambda: second and mirror_state(second["id"]) == ("synced", "registered"), timeout=60
    )
    registration.notes["new_version_mirrored_seconds"] = new_mirror
    registered_events = AuditEvent.objects.filter(action="version.registered").count()
    lost = [] if registered_events == 2 else [f"{registered_events} version.registered, not 2"]
    submitted = AuditEvent.objects.filter(action="version.submit").count()
    lost += [] if submitted == 1 else [f"{submitted} version.submit, not 1"]
    for m in (registration, mirror):
        m.settle(lost=lost)
    registration.check()
    mirror.check()
    assert new_mirror is not None, "the version registered after the outage never reached MLflow"
