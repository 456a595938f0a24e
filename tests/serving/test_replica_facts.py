"""Deployment facts read from the replicas: a replica that disagrees with the
deployment record is a drift, shown in the API and on the page, and promotions
are refused (409) until an admin resolves it. Against real vLLM:
tests/conformance/test_conformance.py (the Llama server)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from core.errors import Conflict
from serving.models import DriftEvent, DriftKind, Replica
from serving.reconcile.tick import reconcile_deployment
from serving.services.promotions import promotion_create
from tests.conftest import actor
from tests.observability.conftest import lora_info

pytestmark = pytest.mark.django_db


def _api(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def test_an_in_sync_replica_reports_the_recorded_facts(deployment, fake_replicas):
    reconcile_deployment(deployment.pk, "beat")
    facts = [r.reported_facts for r in Replica.objects.filter(deployment=deployment)]
    assert facts == [{"base_model": "tiny-llama", "root": fake.base_root} for fake in fake_replicas]
    assert not DriftEvent.objects.filter(kind=DriftKind.FACT_DISPUTED).exists()


def test_another_served_base_model_is_a_drift_and_refuses_promotions(
    root, lena, deployment, fake_replicas, approved_v1
):
    fake_replicas[1].base_model = "other-org/other-model"
    reconcile_deployment(deployment.pk, "beat")

    event = DriftEvent.objects.get(kind=DriftKind.FACT_DISPUTED)
    assert event.replica.base_url == fake_replicas[1].base_url
    assert "other-org/other-model" in event.detail and "tiny-llama" in event.detail
    body = _api(root).get(f"/api/v1/deployments/{deployment.name}/").json()
    assert [(d["fact"], d["reported"]) for d in body["fact_disputes"]] == [
        ("base model", "other-org/other-model")
    ]

    with pytest.raises(Conflict) as refused:
        promotion_create(actor=actor(lena), deployment=deployment, version=approved_v1)
    assert refused.value.code == "replica_facts_disputed"
    assert "base model" in str(refused.value) and "base_model_name" in str(refused.value)

    # Resolved at the replica: the next tick reads the recorded model again.
    fake_replicas[1].base_model = "tiny-llama"
    reconcile_deployment(deployment.pk, "beat")
    promotion_create(actor=actor(lena), deployment=deployment, version=approved_v1)


def test_max_loras_is_read_from_the_metrics_label_and_checked(
    root, lena, deployment, fake_replicas, approved_v1
):
    for fake in fake_replicas:
        fake.metrics_text = lora_info(("", "", 1.0), max_lora=4)
    reconcile_deployment(deployment.pk, "beat")  # reads /metrics once per replica

    assert {r.reported_facts["max_lora"] for r in Replica.objects.all()} == {4}
    assert DriftEvent.objects.filter(kind=DriftKind.FACT_DISPUTED).count() == 2
    with pytest.raises(Conflict) as refused:
        promotion_create(actor=actor(lena), deployment=deployment, version=approved_v1)
    assert "max_loras" in str(refused.value) and "--max-loras 2" in str(refused.value)

    # Resolved by the admin: the record now says what the replicas run with.
    response = _api(root).patch(
        f"/api/v1/deployments/{deployment.name}/",
        {"max_loras": 4, "max_cpu_loras": 8},
        format="json",
    )
    assert response.status_code == 200, response.content
    assert response.json()["fact_disputes"] == []
    deployment.refresh_from_db()
    promotion_create(actor=actor(lena), deployment=deployment, version=approved_v1)


def test_the_same_facts_are_not_written_again(deployment, fake_replicas):
    for fake in fake_replicas:
        fake.metrics_text = lora_info(("", "", 1.0), max_lora=2)
    reconcile_deployment(deployment.pk, "beat")  # reads /metrics once per replica
    reconcile_deployment(deployment.pk, "beat")
    report = reconcile_deployment(deployment.pk, "beat")
    assert report.in_sync == 2 and not report.attempts_written
    assert {r.reported_facts["max_lora"] for r in Replica.objects.all()} == {2}


def test_register_local_deployment_reads_the_facts_from_the_live_replica(root, tmp_path):
    from django.core.management import call_command

    from serving.models import Deployment
    from tests.support.vllm_standin import serve_standin

    replica = serve_standin()
    try:
        replica.metrics_text = lora_info(("", "", 1.0), max_lora=3)
        call_command("register_local_deployment", url=[replica.base_url], volume=str(tmp_path))
    finally:
        replica.close()
    deployment = Deployment.objects.get(name="local-cpu")
    assert (deployment.base_model_name, deployment.max_loras) == ("tiny-llama", 3)


def test_register_local_deployment_takes_the_vllm_key_from_a_file_or_stdin(
    root, tmp_path, monkeypatch
):
    """docker-compose.yml's replicas read their key from a secret file: the
    deployment is registered from the same file (or standard input), so the
    key the control plane sends is theirs, and it is never on a command line."""
    import io

    from django.core.management import CommandError, call_command

    from serving.models import Deployment
    from tests.support.vllm_standin import serve_standin

    key_file = tmp_path / "vllm_api_key"
    key_file.write_text("from-the-secret-file\n")
    replica = serve_standin()
    try:
        call_command(
            "register_local_deployment",
            url=[replica.base_url],
            volume=str(tmp_path),
            api_key_file=str(key_file),
        )
        assert Deployment.objects.get(name="local-cpu").vllm_api_key == "from-the-secret-file"
        monkeypatch.setattr("sys.stdin", io.StringIO("from-stdin\n"))
        call_command(
            "register_local_deployment",
            url=[replica.base_url],
            volume=str(tmp_path),
            api_key_file="-",
        )
        assert Deployment.objects.get(name="local-cpu").vllm_api_key == "from-stdin"
        key_file.write_text("")
        with pytest.raises(CommandError, match="is empty"):
            call_command(
                "register_local_deployment",
                url=[replica.base_url],
                volume=str(tmp_path),
                api_key_file=str(key_file),
            )
    finally:
        replica.close()


def test_a_dispute_reported_again_is_the_same_drift_event_counted(deployment, fake_replicas):
    # Through the one drift recorder (serving.records.drifts): a replica whose
    # max_lora flips away and back to the disputed value is one event, seen twice.
    reconcile_deployment(deployment.pk, "beat")
    for max_lora in (4, 2, 4):  # 2 agrees with the record again: no event
        fake_replicas[0].metrics_text = lora_info(("", "", 1.0), max_lora=max_lora)
        reconcile_deployment(deployment.pk, "beat")

    event = DriftEvent.objects.get(kind=DriftKind.FACT_DISPUTED)
    assert (event.replica.base_url, event.count) == (fake_replicas[0].base_url, 2)


def test_a_load_refused_for_its_rank_disputes_the_recorded_max_lora_rank(
    root, lena, deployment, fake_replicas, approved_v1, approved_v2
):
    from serving.rollouts.engine import rollout_execute

    fake_replicas[1].max_lora_rank = 4  # started with --max-lora-rank 4; recorded 16
    promotion = promotion_create(actor=actor(lena), deployment=deployment, version=approved_v1)
    assert rollout_execute(promotion.rollouts.get().pk, "w") == "rolled_back"  # rank 8 > 4

    event = DriftEvent.objects.get(kind=DriftKind.FACT_DISPUTED)
    assert event.replica.base_url == fake_replicas[1].base_url
    assert "max_lora_rank 4" in event.detail and "records 16" in event.detail
    reconcile_deployment(deployment.pk, "beat")  # the listing's facts do not erase it
    with pytest.raises(Conflict) as refused:
        promotion_create(actor=actor(lena), deployment=deployment, version=approved_v2)
    assert refused.value.code == "replica_facts_disputed"
    assert "--max-lora-rank 16" in str(refused.value)

    # Resolved by the admin: the record says 4, and the gate now refuses rank 8 itself.
    response = _api(root).patch(
        f"/api/v1/deployments/{deployment.name}/", {"max_lora_rank": 4}, format="json"
    )
    assert response.status_code == 200, response.content
    assert response.json()["fact_disputes"] == []


def test_register_local_deployment_takes_a_base_model_reached_through_a_symlink(
    root, tmp_path, lena, approved_v1
):
    """vLLM reports its base model's root as it was started (`make run` from a
    clone behind a symlink: the link); the record holds the resolved folder.
    Both spellings are the record's, so the facts check finds no dispute."""
    import json

    from django.core.management import call_command

    from serving.models import Deployment
    from tests.support.vllm_standin import serve_standin

    model = tmp_path / "real" / "tiny-llama"
    model.mkdir(parents=True)
    (model / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "hidden_size": 128,
                "intermediate_size": 256,
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "num_key_value_heads": 2,
                "vocab_size": 300,
            }
        )
    )
    (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    linked = str(tmp_path / "link" / "tiny-llama")
    replica = serve_standin(base_root=linked)
    try:
        call_command(
            "register_local_deployment", url=[replica.base_url], volume=str(tmp_path / "v"),
            base_model_path=linked,
        )  # fmt: skip
        deployment = Deployment.objects.get(name="local-cpu")
        assert str(model.resolve()) in deployment.base_model_aliases
        reconcile_deployment(deployment.pk, "beat")
    finally:
        replica.close()
    assert not DriftEvent.objects.filter(kind=DriftKind.FACT_DISPUTED).exists()
    assert Replica.objects.get(deployment=deployment).reported_facts["root"] == linked
