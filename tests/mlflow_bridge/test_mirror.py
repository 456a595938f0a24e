"""The registry mirrored into a real MLflow Model Registry: registered models,
versions with their status, per-deployment aliases, and catching up after an
outage."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from mlflow_bridge.mirror import (
    alias_name,
    mirror_alias_clear,
    mirror_alias_set,
    registered_model_name,
)
from mlflow_bridge.models import MirrorState, MlflowAliasMirror, MlflowVersionMirror
from registry.services.versions import version_transition
from tests.conftest import actor
from tests.factories import make_version
from tests.mlflow_bridge.conftest import TrainingRun, log_run
from tests.serving.conftest import make_deployment
from tests.support.adapters import AdapterSpec

pytestmark = pytest.mark.mlflow


@pytest.fixture
def prod_legal_gpu(root, tmp_path):
    return make_deployment(root, ["http://127.0.0.1:9"], tmp_path / "volume", name="prod-legal-gpu")


@pytest.fixture
def on_commit(django_capture_on_commit_callbacks):
    """Runs transaction.on_commit callbacks (the task enqueues) at the block's end."""
    return lambda: django_capture_on_commit_callbacks(execute=True)


def register_from_run(client, adapter, tracking, tmp_path, on_commit, **run) -> dict:
    run_id = log_run(tracking, tmp_path, TrainingRun(**run))
    with on_commit():
        response = client.post(
            f"/api/v1/adapters/{adapter.pk}/versions/from-mlflow-run/",
            {"run_id": run_id, "artifact_path": "adapter"},
            format="json",
        )
    assert response.status_code == 201, response.json()
    # The response was written before the commit; the mirror ran after it.
    version_id = response.json()["id"]
    body = client.get(f"/api/v1/versions/{version_id}/").json()
    body["mlflow_mirror"] = client.get(f"/api/v1/versions/{version_id}/mlflow-mirror/").json()
    return body


def transition(user, version_id, action, on_commit, comment=""):
    from registry.models import AdapterVersion

    with on_commit():
        return version_transition(
            actor=actor(user),
            version=AdapterVersion.objects.get(pk=version_id),
            action=action,
            comment=comment,
        )


def mlflow_version(tracking, adapter, number: str):
    return tracking.get_model_version(registered_model_name(adapter), number)


def test_a_version_from_a_run_becomes_an_mlflow_model_version_sourced_from_the_run(
    mlflow_on, tracking, adapter, as_token, tmp_path, on_commit
):
    body = register_from_run(as_token, adapter, tracking, tmp_path, on_commit)

    mirror = body["mlflow_mirror"]
    assert mirror["state"] == "synced", mirror
    assert mirror["registered_model"] == f"legal.{adapter.name}"
    model = tracking.get_registered_model(mirror["registered_model"])
    assert model.tags["department"] == "legal"
    assert model.tags["registry_adapter_id"] == str(adapter.pk)
    found = mlflow_version(tracking, adapter, mirror["model_version"])
    run_id = body["lineage"]["mlflow_run_id"]
    assert found.source == f"runs:/{run_id}/adapter"
    assert found.run_id == run_id
    assert found.tags["registry_version_id"] == str(body["id"])
    assert found.tags["status"] == "registered"
    assert found.tags["sha256"] == body["manifest_sha256"]
    assert mirror["url"] == (
        f"{mlflow_on.url}/#/models/{mirror['registered_model']}/versions/{found.version}"
    )


def test_an_uploaded_version_is_sourced_from_the_registry_store(
    mlflow_on, tracking, adapter, lena, tmp_path, on_commit
):
    with on_commit():
        version = make_version(lena, adapter, AdapterSpec(seed=7))

    mirror = MlflowVersionMirror.objects.get(version=version)
    assert mirror.state == MirrorState.SYNCED
    found = mlflow_version(tracking, adapter, mirror.model_version)
    assert found.source == version.artifact_uri and found.source.startswith("s3://")


def test_status_changes_update_the_tags(
    mlflow_on, tracking, adapter, as_token, lena, alex, tmp_path, on_commit
):
    first = register_from_run(as_token, adapter, tracking, tmp_path, on_commit)
    second = register_from_run(
        as_token, adapter, tracking, tmp_path, on_commit, spec=AdapterSpec(seed=3)
    )
    transition(lena, first["id"], "submit", on_commit)
    transition(alex, first["id"], "approve", on_commit)
    transition(lena, second["id"], "submit", on_commit)
    transition(alex, second["id"], "reject", on_commit, comment="eval_loss too high")

    def status_in_mlflow(body):
        number = MlflowVersionMirror.objects.get(version_id=body["id"]).model_version
        return mlflow_version(tracking, adapter, number).tags

    assert status_in_mlflow(first)["status"] == "approved"
    assert status_in_mlflow(first)["reviewed_by"] == "alex"
    assert status_in_mlflow(second)["status"] == "rejected"

    transition(alex, first["id"], "deprecate", on_commit)

    assert status_in_mlflow(first)["status"] == "deprecated"
    versions = tracking.search_model_versions(f"name='{registered_model_name(adapter)}'")
    assert len(versions) == 2  # updated in place, never duplicated


def test_deployment_aliases_follow_promotion_rollback_and_retirement(
    mlflow_on, tracking, adapter, as_token, as_lena, tmp_path, on_commit, prod_legal_gpu
):
    v1 = register_from_run(as_token, adapter, tracking, tmp_path, on_commit)
    v2 = register_from_run(
        as_token, adapter, tracking, tmp_path, on_commit, spec=AdapterSpec(seed=4)
    )
    from registry.models import AdapterVersion

    version1, version2 = (
        AdapterVersion.objects.get(pk=v1["id"]),
        AdapterVersion.objects.get(pk=v2["id"]),
    )
    name = registered_model_name(adapter)

    def alias_target():
        aliases = tracking.get_registered_model(name).aliases
        return aliases.get("prod-legal-gpu")

    with on_commit():
        mirror_alias_set(deployment=prod_legal_gpu, adapter=adapter, version=version1)
    assert alias_target() == v1["mlflow_mirror"]["model_version"]

    with on_commit():  # promotion of v2
        mirror_alias_set(deployment=prod_legal_gpu, adapter=adapter, version=version2)
    assert alias_target() == v2["mlflow_mirror"]["model_version"]

    with on_commit():  # rollback
        mirror_alias_set(deployment=prod_legal_gpu, adapter=adapter, version=version1)
    assert alias_target() == v1["mlflow_mirror"]["model_version"]
    rows = as_lena.get(f"/api/v1/adapters/{adapter.pk}/mlflow-aliases/").json()
    assert [(r["alias"], r["version"], r["state"]) for r in rows] == [
        ("prod-legal-gpu", version1.pk, "synced")
    ]

    with on_commit():
        mirror_alias_clear(deployment=prod_legal_gpu, adapter=adapter)
    assert alias_target() is None
    assert MlflowAliasMirror.objects.get(alias="prod-legal-gpu").state == MirrorState.SYNCED


def test_alias_names_are_slugs_that_mlflow_accepts():
    assert alias_name("prod-finance-gpu") == "prod-finance-gpu"
    assert alias_name("Prod Finance / GPU #2") == "prod-finance-gpu-2"
    assert alias_name("latest") == "deploy-latest"
    assert alias_name("v2") == "deploy-v2"


def test_mlflow_down_never_blocks_an_approval_and_the_mirror_catches_up(
    mlflow_on, tracking, adapter, as_token, as_lena, as_alex, tmp_path, on_commit, prod_legal_gpu
):
    body = register_from_run(as_token, adapter, tracking, tmp_path, on_commit)
    version_id = body["id"]
    from registry.models import AdapterVersion

    mlflow_on.stop()
    try:
        with on_commit():
            assert as_lena.post(f"/api/v1/versions/{version_id}/submit/").status_code == 200
        with on_commit():
            approved = as_alex.post(f"/api/v1/versions/{version_id}/approve/")
            with on_commit():
                mirror_alias_set(
                    deployment=prod_legal_gpu,
                    adapter=adapter,
                    version=AdapterVersion.objects.get(pk=version_id),
                )
        assert approved.status_code == 200
        assert approved.json()["status"] == "approved"

        mirror = as_alex.get(f"/api/v1/versions/{version_id}/mlflow-mirror/").json()
        assert mirror["state"] == "pending"
        assert "MLflow" in mirror["last_error"] and "unreachable" in mirror["last_error"]
        assert mirror["attempts"] >= 1
        assert mirror["status_in_mlflow"] == "registered"
        alias = MlflowAliasMirror.objects.get(adapter=adapter)
        assert alias.state == MirrorState.PENDING
        health = as_alex.get("/readyz").json()
        assert health["status"] == "ok"  # an MLflow outage does not fail readiness
        assert health["checks"]["mlflow"]["ok"] is False
    finally:
        mlflow_on.start()

    call_command("mlflow_resync", "--pending-only")

    mirror = as_alex.get(f"/api/v1/versions/{version_id}/mlflow-mirror/").json()
    assert (mirror["state"], mirror["status_in_mlflow"], mirror["last_error"]) == (
        "synced",
        "approved",
        "",
    )
    found = mlflow_version(tracking, adapter, mirror["model_version"])
    assert found.tags["status"] == "approved"
    model = tracking.get_registered_model(registered_model_name(adapter))
    assert model.aliases == {"prod-legal-gpu": mirror["model_version"]}
    assert MlflowAliasMirror.objects.get(adapter=adapter).state == MirrorState.SYNCED


def test_the_catch_up_task_retries_pending_rows(
    mlflow_on, tracking, adapter, lena, settings, on_commit
):
    from mlflow_bridge.tasks import catch_up

    settings.MLFLOW_MIRROR_ENABLED = False
    version = make_version(lena, adapter, AdapterSpec(seed=11))
    settings.MLFLOW_MIRROR_ENABLED = True
    mirror = MlflowVersionMirror.objects.create(version=version)

    assert catch_up() == {"versions": 1, "aliases": 0, "webhooks": 0, "webhook_refusals_audited": 0}

    mirror.refresh_from_db()
    assert mirror.state == MirrorState.SYNCED
    assert catch_up() == {"versions": 0, "aliases": 0, "webhooks": 0, "webhook_refusals_audited": 0}


def test_resync_is_idempotent_and_mirrors_versions_made_while_it_was_off(
    mlflow_on, tracking, adapter, lena, settings, on_commit
):
    settings.MLFLOW_MIRROR_ENABLED = False
    version = make_version(lena, adapter, AdapterSpec(seed=12))
    settings.MLFLOW_MIRROR_ENABLED = True
    assert not MlflowVersionMirror.objects.filter(version=version).exists()

    call_command("mlflow_resync")
    call_command("mlflow_resync")

    assert MlflowVersionMirror.objects.get(version=version).state == MirrorState.SYNCED
    name = registered_model_name(adapter)
    assert len(tracking.search_model_versions(f"name='{name}'")) == 1


def test_readiness_counts_mlflow_as_optional_when_it_is_off(settings, anonymous, db):
    settings.MLFLOW_TRACKING_URI = ""

    check = anonymous.get("/readyz").json()["checks"]["mlflow"]

    assert check == {"ok": True, "optional": True}


class FakeTask:
    """Just enough of a bound Celery task to drive the retry policy."""

    class request:
        is_eager = False
        retries = 0

    def retry(self, countdown, max_retries):
        from celery.exceptions import Retry

        self.countdown = countdown
        return Retry()


def test_a_worker_retries_transient_failures_with_backoff_then_marks_them_failed(
    settings, lena, adapter
):
    from celery.exceptions import Retry

    from mlflow_bridge.client import MlflowUnavailable
    from mlflow_bridge.tasks import _run

    settings.MLFLOW_MIRROR_MAX_RETRIES = 3
    settings.MLFLOW_MIRROR_BACKOFF_SECONDS = 10
    settings.MLFLOW_MIRROR_ENABLED = False
    row = MlflowVersionMirror.objects.create(version=make_version(lena, adapter))

    def down(**kwargs):
        raise MlflowUnavailable("MLflow at http://mlflow is unreachable")

    task = FakeTask()
    task.request.retries = 2
    with pytest.raises(Retry):
        _run(task, MlflowVersionMirror, row.pk, down, "mirror_id")
    assert 20 <= task.countdown <= 40  # 10 s doubled twice, with jitter

    task.request.retries = 3
    assert _run(task, MlflowVersionMirror, row.pk, down, "mirror_id") == "failed"
    row.refresh_from_db()
    assert (row.state, row.last_error) == ("failed", "MLflow at http://mlflow is unreachable")
