"""4. S3 goes down during ingest, and during staging. The store is the real S3
API (moto server) reached through a TCP proxy that leaves the network: every
client sees "connection refused", as when the object store's host is gone."""

from __future__ import annotations

import time

import pytest
from django.conf import settings

from core.models import AuditEvent
from registry.models import AdapterVersion
from serving.models import Rollout
from tests.faults.conftest import answers
from tests.serving.vllm.conftest import _upload, ok
from tests.support.adapters import AdapterSpec
from tests.support.s3_server import s3_client

pytestmark = pytest.mark.django_db(transaction=True)


def objects_in(endpoint: str, bucket: str) -> list[str]:
    listing = s3_client(endpoint).list_objects_v2(Bucket=bucket)
    return [item["Key"] for item in listing.get("Contents", [])]


def test_an_upload_while_s3_is_down_is_a_503_naming_the_store_and_a_retry_succeeds(
    platform, s3_behind_proxy, s3_endpoint, measure
):
    m = measure("4a. S3 down during ingest (503, nothing written; retry after)", 30)
    proxy, bucket = s3_behind_proxy
    adapter_id = platform.adapter("contracts", "legal-contracts")
    url = f"/api/v1/adapters/{adapter_id}/versions/"
    spec = AdapterSpec(seed=4)

    with proxy.down():
        response = platform.member.post(url, {"files": [_upload(spec)]}, format="multipart")
        assert response.status_code == 503, (response.status_code, response.content[:500])
        error = response.json()["error"]
        m.notes["error"] = error["message"]
        assert error["code"] == "artifact_store_unavailable"
        assert "artifact store" in error["message"]
        # Nothing half-written: no row, no object, no staged file, no audit event.
        assert not AdapterVersion.objects.exists()
        assert objects_in(s3_endpoint, bucket) == []
        assert list(settings.INGEST_STAGING_DIR.iterdir()) == []
        assert not AuditEvent.objects.filter(action="version.registered").exists()
    m.fault_ended()

    created = {}

    def registered() -> bool:
        again = platform.member.post(url, {"files": [_upload(spec)]}, format="multipart")
        created.update(again.json() if again.status_code == 201 else {})
        return again.status_code == 201

    m.converge(registered)
    m.settle(
        lost=[]
        if AuditEvent.objects.filter(action="version.registered").count() == 1
        else ["version.registered not recorded exactly once"]
    )
    m.check()
    assert objects_in(s3_endpoint, bucket), "the retried upload stored nothing"
    assert AdapterVersion.objects.get().manifest_sha256 == created["manifest_sha256"]


def test_a_rollout_that_cannot_stage_while_s3_is_down_converges_once_s3_is_back(
    stack, platform, replicas, s3_behind_proxy, measure
):
    m = measure("4b. S3 down during staging", 60)
    proxy, _ = s3_behind_proxy
    stack.use_broker("redis")
    stack.start_worker()
    stack.start_beat()
    a, b = replicas
    platform.create_deployment("faults", [a.base_url, b.base_url])
    version = platform.approved_version("contracts", "legal-contracts", AdapterSpec(seed=5))

    with proxy.down():
        rollout_id = ok(platform.promote("faults", version["id"]), 201)["rollout"]
        started = m.converge(
            lambda: Rollout.objects.get(pk=rollout_id).started_at is not None, timeout=60
        )
        assert started is not None, "the worker never picked the rollout up"
        time.sleep(3)  # the worker's reads of the artifact are refused meanwhile
        m.notes["status_while_down"] = Rollout.objects.get(pk=rollout_id).status
    m.fault_ended()

    def served_everywhere() -> bool:
        return (
            Rollout.objects.get(pk=rollout_id).status == "succeeded"
            and answers(a.base_url, "legal-contracts")
            and answers(b.base_url, "legal-contracts")
        )

    m.converge(served_everywhere)
    m.settle()
    rollout = Rollout.objects.get(pk=rollout_id)
    m.notes["final_status"] = rollout.status
    m.notes["final_error"] = rollout.error[:300]
    m.check()
