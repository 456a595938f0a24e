"""Issue 21, item 5: what a member or a token reads about a rollout passes one
redaction (core.redaction): "Staging failed: <volume path> ..." and "Waiting
for the artifact store: <endpoint> <bucket>" named the infrastructure."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.redaction import redact
from registry.artifact_store import get_artifact_store
from serving.rollouts.engine import rollout_execute
from serving.services.promotions import promotion_create
from serving.volume import stage_version
from tests.conftest import actor
from tests.support.s3_server import free_port

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "text, hidden",
    [
        ("cannot write /var/lib/registry/ingest/x: Permission denied", "/var/lib/registry"),
        (
            "reading s3://adapters-prod/registry/legal/v1/a.json failed: "
            'Could not connect to the endpoint URL: "http://10.4.0.7:9000/adapters-prod"',
            "10.4.0.7",
        ),
        ("connection error: minio:9000 refused", "minio:9000"),
        ("HTTPConnectionPool(host='vllm-0.vllm.ml.svc.cluster.local', port=8000)", "svc.cluster"),
        ("listen on [::1]? no: 192.168.1.20:8443 timed out", "192.168.1.20"),
    ],
)
def test_redact_strips_hosts_ports_paths_and_endpoints(text, hidden):
    assert hidden not in redact(text)


def test_redact_keeps_what_a_member_needs():
    text = "adapter_config.json: target_modules 'q_proj' is not in the base model (v3)"
    assert redact(text) == text


def test_redact_strips_the_configured_bucket_even_alone(settings):
    settings.ARTIFACT_STORE_URL = "s3://quiet-bucket-name/registry"
    assert "quiet-bucket-name" not in redact("bucket 'quiet-bucket-name' does not exist")


def rollout_error_as(client, rollout_id) -> str:
    response = client.get(f"/api/v1/rollouts/{rollout_id}/")
    assert response.status_code == 200, response.content[:300]
    return response.json()["error"]


def test_a_staging_failure_shows_members_no_volume_path(
    lena, deployment, approved_v1, fake_replicas, as_lena, as_token, as_root
):
    # The folder exists with other bytes: staging refuses, naming the path.
    folder = Path(stage_version(deployment, approved_v1).write_path)
    weights = folder / "adapter_model.safetensors"
    weights.chmod(0o644)
    weights.write_bytes(b"tampered")
    promotion = promotion_create(actor=actor(lena), deployment=deployment, version=approved_v1)
    rollout = promotion.rollouts.get()

    assert rollout_execute(rollout.pk, "w") == "failed"

    assert str(folder) in rollout_error_as(as_root, rollout.pk)
    for client in (as_lena, as_token):
        error = rollout_error_as(client, rollout.pk)
        assert error.startswith("Staging failed: ") and "does not match" in error
        assert deployment.volume_write_path not in error and str(folder.parent) not in error


def test_waiting_for_the_store_shows_members_no_endpoint_or_bucket(
    lena, deployment, approved_v1, fake_replicas, as_lena, as_root, settings
):
    promotion = promotion_create(actor=actor(lena), deployment=deployment, version=approved_v1)
    rollout = promotion.rollouts.get()
    port = free_port()  # nothing listens: connection refused, as when the store is down
    settings.ARTIFACT_STORE_URL = "s3://private-adapters/registry"
    settings.ARTIFACT_S3 = {
        **settings.ARTIFACT_S3,
        "endpoint_url": f"http://127.0.0.1:{port}",
        "access_key": "k",
        "secret_key": "s",
        "addressing_style": "path",
        "connect_timeout": 1,
        "read_timeout": 1,
        "max_attempts": 1,
    }
    get_artifact_store.cache_clear()

    rollout_execute(rollout.pk, "w")  # stays in staging; the sweeper resumes it

    admin_sees = rollout_error_as(as_root, rollout.pk)
    assert admin_sees.startswith("Waiting for the artifact store: ") and str(port) in admin_sees
    member_sees = rollout_error_as(as_lena, rollout.pk)
    assert member_sees.startswith("Waiting for the artifact store: ")
    for hidden in (str(port), "127.0.0.1", "private-adapters"):
        assert hidden not in member_sees
