from datetime import timedelta

import pytest
from django.utils import timezone

from serving.capacity import ColdLoad, cold_load
from serving.gate import evaluate_gate
from serving.models import (
    HttpAttempt,
    Replica,
    Rollout,
    RolloutKind,
    RolloutStatus,
    ServedAdapter,
)
from serving.rules.base_models import module_dims_for
from serving.services.promotions import promotion_create
from tests.conftest import actor
from tests.factories import make_adapter, make_approved_version
from tests.serving.conftest import make_deployment
from tests.support.adapters import AdapterSpec

pytestmark = pytest.mark.django_db


def checks(report):
    return {c.name: c for c in report.checks}


def test_a_compatible_version_passes_every_check(deployment, approved_v1):
    report = evaluate_gate(deployment, approved_v1)
    assert report.passed, report.as_list()
    assert {c.name for c in report.checks} == {
        "base_model",
        "rank",
        "target_modules",
        "shapes",
        "capacity",
        "host_cache",
        "memory",
    }


def test_another_base_model_of_the_same_shape_is_refused(lena, alex, deployment, contracts):
    version = make_approved_version(lena, alex, contracts, AdapterSpec(base_model="other/tiny"))
    check = checks(evaluate_gate(deployment, version))["base_model"]
    assert not check.ok
    assert "other/tiny" in check.message and "tiny-llama" in check.message


def test_base_model_aliases_count_as_the_same_model(lena, alex, deployment, contracts):
    deployment.base_model_aliases = ["org/tiny-llama-v1"]
    version = make_approved_version(
        lena, alex, contracts, AdapterSpec(base_model="org/tiny-llama-v1")
    )
    assert checks(evaluate_gate(deployment, version))["base_model"].ok


def test_rank_above_max_lora_rank_is_refused(lena, alex, deployment, contracts):
    version = make_approved_version(lena, alex, contracts, AdapterSpec(r=32))
    check = checks(evaluate_gate(deployment, version))["rank"]
    assert not check.ok and "max_lora_rank 16" in check.message


def test_target_module_missing_from_the_architecture_is_refused(deployment, approved_v1):
    deployment.module_dims = {"q_proj": [128, 128]}
    check = checks(evaluate_gate(deployment, approved_v1))["target_modules"]
    assert not check.ok and "v_proj" in check.message


def test_shapes_of_another_hidden_size_are_refused(lena, alex, deployment, contracts):
    version = make_approved_version(lena, alex, contracts, AdapterSpec(hidden=256))
    check = checks(evaluate_gate(deployment, version))["shapes"]
    assert not check.ok and "q_proj is 256x256, the model has 128x128" in check.message


def test_more_layers_than_the_model_is_refused(lena, alex, deployment, contracts):
    version = make_approved_version(lena, alex, contracts, AdapterSpec(layers=3))
    assert not checks(evaluate_gate(deployment, version))["shapes"].ok


def serve_another(lena, alex, legal, deployment, name="nda", seed=9):
    other = make_adapter(lena, legal, name=name)
    version = make_approved_version(lena, alex, other, AdapterSpec(seed=seed))
    return ServedAdapter.objects.create(deployment=deployment, adapter=other, version=version)


def load_attempts(replica, durations, *, purpose="load", ok=True):
    start = timezone.now() - timedelta(hours=1)
    HttpAttempt.objects.bulk_create(
        HttpAttempt(
            replica=replica,
            purpose=purpose,
            method="POST",
            url=f"{replica.base_url}/v1/load_lora_adapter",
            started_at=start + timedelta(seconds=i),
            duration_ms=ms,
            status_code=200 if ok else 500,
            ok=ok,
        )
        for i, ms in enumerate(durations)
    )


def test_the_gate_passes_adapters_above_max_cpu_loras(lena, alex, legal, deployment, approved_v1):
    deployment.max_loras = deployment.max_cpu_loras = 1
    serve_another(lena, alex, legal, deployment)

    report = evaluate_gate(deployment, approved_v1)

    assert report.passed, report.as_list()
    capacity, host = checks(report)["capacity"], checks(report)["host_cache"]
    assert capacity.ok and capacity.message == (
        "2 of 500 registered adapters (max_registered_adapters)."
    )
    assert not host.ok and host.advisory
    assert "2 adapters registered, 1 cached in host memory (max_cpu_loras)" in host.message
    assert "no load on this deployment's replicas has been measured yet" in host.message


def test_above_max_cpu_loras_the_gate_predicts_the_cold_load_from_the_replicas_loads(
    root, lena, alex, legal, deployment, approved_v1, tmp_path
):
    deployment.max_loras = deployment.max_cpu_loras = 1
    serve_another(lena, alex, legal, deployment)
    a, b = (
        Replica.objects.create(deployment=deployment, base_url=u) for u in ("http://a", "http://b")
    )
    load_attempts(a, [10, 20, 30, 40, 50])
    load_attempts(b, [60, 70, 80, 90, 100])
    # Neither failed loads, nor other calls, nor another deployment's replicas count.
    load_attempts(a, [5000], ok=False)
    load_attempts(b, [9000], purpose="verify_completion")
    elsewhere = make_deployment(root, ["http://c"], tmp_path / "elsewhere", name="elsewhere")
    load_attempts(Replica.objects.create(deployment=elsewhere, base_url="http://c"), [7000])

    host = checks(evaluate_gate(deployment, approved_v1))["host_cache"]

    assert host.advisory and not host.ok
    assert (
        "predicted cold-load latency 55 ms median, 100 ms p95 (from the 10 most recent "
        "successful loads on this deployment's replicas)" in host.message
    )


def test_the_prediction_reads_only_the_newest_loads(deployment):
    replica = Replica.objects.create(deployment=deployment, base_url="http://a")
    load_attempts(replica, [1000, 1000, 1000, 10, 20, 30])
    assert cold_load(deployment, samples=3) == ColdLoad(3, 20, 30)
    assert cold_load(deployment).samples == 6


def test_within_max_cpu_loras_nothing_is_cold(deployment, approved_v1):
    host = checks(evaluate_gate(deployment, approved_v1))["host_cache"]
    assert host.ok
    assert host.message == (
        "1 of 4 adapters in vLLM's host cache (max_cpu_loras): none is re-read from disk."
    )


def test_registered_adapters_over_the_limit_are_refused(lena, alex, legal, deployment, approved_v1):
    deployment.max_registered_adapters = 1
    serve_another(lena, alex, legal, deployment)

    report = evaluate_gate(deployment, approved_v1)

    capacity = checks(report)["capacity"]
    assert not report.passed and not capacity.ok and not capacity.advisory
    assert capacity.message == (
        "2 adapters would exceed staging-cpu's limit of 1 registered adapters "
        "(max_registered_adapters): retire one, or raise the limit."
    )


def test_a_new_version_of_a_served_adapter_takes_its_place(
    lena, alex, deployment, approved_v1, approved_v2
):
    deployment.max_registered_adapters = 1
    ServedAdapter.objects.create(
        deployment=deployment, adapter=approved_v1.adapter, version=approved_v1
    )
    assert checks(evaluate_gate(deployment, approved_v2))["capacity"].ok


def test_retired_adapters_do_not_count(lena, alex, legal, deployment, approved_v1):
    deployment.max_registered_adapters = 1
    served = serve_another(lena, alex, legal, deployment)
    served.version = None
    served.save()
    assert checks(evaluate_gate(deployment, approved_v1))["capacity"].ok


def test_promotions_still_rolling_out_count_against_the_limit(
    lena, alex, legal, deployment, approved_v1
):
    """Promotions sent in a burst each see the others before any rollout succeeded."""
    deployment.max_registered_adapters = 1
    other = make_adapter(lena, legal, name="nda")
    other_v1 = make_approved_version(lena, alex, other, AdapterSpec(seed=9))
    rollout = Rollout.objects.create(
        deployment=deployment,
        adapter=other,
        kind=RolloutKind.PROMOTE,
        target_version=other_v1,
        status=RolloutStatus.LOADING,
    )
    assert not checks(evaluate_gate(deployment, approved_v1))["capacity"].ok

    rollout.status = RolloutStatus.FAILED
    rollout.save()
    assert checks(evaluate_gate(deployment, approved_v1))["capacity"].ok


def test_the_api_promotes_an_adapter_above_max_cpu_loras(
    as_lena, lena, alex, legal, deployment, approved_v1, fake_replicas
):
    deployment.max_loras = deployment.max_cpu_loras = 1
    deployment.save()
    serve_another(lena, alex, legal, deployment)

    response = as_lena.post(
        "/api/v1/promotions/",
        {"deployment": deployment.name, "version": approved_v1.pk},
        format="json",
    )

    assert response.status_code == 201, response.json()
    report = {c["name"]: c for c in response.json()["gate_report"]}
    assert report["host_cache"]["advisory"] and not report["host_cache"]["ok"]
    assert "1 cached in host memory" in report["host_cache"]["message"]


# The tiny deployment's pool as vLLM allocates it (tests/observability/test_planner.py):
# 2 slots x 16 x 5632 values x 2 bytes (SERVING_DTYPE float16).
TINY_SLOT = 16 * 5632 * 2
TINY_POOL = 2 * TINY_SLOT


def test_a_pool_over_the_gpu_share_refuses_the_promotion(deployment, approved_v1):
    deployment.gpu_memory_bytes = 2 * 1024 * 1024
    deployment.lora_memory_share = 0.15
    report = evaluate_gate(deployment, approved_v1)
    memory = checks(report)["memory"]
    assert not memory.ok and not memory.advisory and not report.passed
    assert f"LoRA pool {TINY_POOL} bytes (2 slots x {TINY_SLOT} bytes" in memory.message
    assert "17.2% of GPU memory 2097152 bytes, budget 15% = 314572 bytes" in memory.message


def test_a_pool_within_the_share_passes(deployment, approved_v1):
    deployment.gpu_memory_bytes = 16 * 1024**3
    memory = checks(evaluate_gate(deployment, approved_v1))["memory"]
    assert memory.ok and not memory.advisory
    assert f"LoRA pool {TINY_POOL} bytes" in memory.message


def test_without_gpu_memory_the_pool_is_only_reported(deployment, approved_v1):
    memory = checks(evaluate_gate(deployment, approved_v1))["memory"]
    assert memory.ok and memory.advisory
    assert "GPU memory not configured" in memory.message


def test_the_api_refuses_a_promotion_whose_pool_exceeds_the_share(
    as_lena, deployment, approved_v1, fake_replicas
):
    deployment.gpu_memory_bytes = 2 * 1024 * 1024
    deployment.save()
    response = as_lena.post(
        "/api/v1/promotions/",
        {"deployment": deployment.name, "version": approved_v1.pk},
        format="json",
    )
    assert response.status_code == 422
    refused = [c for c in response.json()["error"]["details"]["checks"] if not c["ok"]]
    assert [c["name"] for c in refused] == ["memory"]
    assert "lower max_loras or max_lora_rank" in refused[0]["message"]
    assert not ServedAdapter.objects.exists()
    assert all(not replica.requests for replica in fake_replicas)


def test_promotion_refused_by_the_gate_is_422_and_calls_no_replica(
    as_lena, lena, alex, deployment, contracts, fake_replicas
):
    version = make_approved_version(lena, alex, contracts, AdapterSpec(r=32))
    response = as_lena.post(
        "/api/v1/promotions/", {"deployment": deployment.name, "version": version.pk}, format="json"
    )
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "compatibility_gate_failed"
    assert "max_lora_rank" in error["message"]
    assert any(c["name"] == "rank" and not c["ok"] for c in error["details"]["checks"])
    assert all(not r.requests for r in fake_replicas)


def test_only_approved_versions_can_be_promoted(lena, deployment, contracts):
    from core.errors import Conflict
    from tests.factories import make_version

    version = make_version(lena, contracts)
    with pytest.raises(Conflict, match="registered"):
        promotion_create(actor=actor(lena), deployment=deployment, version=version)


def test_an_embedding_lora_on_an_architecture_vllm_serves_none_for_names_the_fix(
    lena, alex, deployment, contracts
):
    # vLLM's Qwen2 model declares no embedding_modules: it refuses embed_tokens
    # LoRA (tests/conformance, "target embed_tokens" on qwen2).
    deployment.architecture = "Qwen2ForCausalLM"
    deployment.module_dims = module_dims_for(
        {"architecture": "Qwen2ForCausalLM", "hidden_size": 128, "intermediate_size": 256}
    )
    version = make_approved_version(lena, alex, contracts, AdapterSpec())
    version.target_modules = ["embed_tokens", "q_proj", "v_proj"]
    check = checks(evaluate_gate(deployment, version))["target_modules"]
    assert not check.ok
    assert "Qwen2ForCausalLM" in check.message
    assert "Retrain without embed_tokens" in check.message


def test_the_host_cache_is_the_deployments_total_when_adapters_have_bounds(
    lena, alex, legal, deployment, contracts, approved_v1, tmp_path
):
    # 2 replicas x max_cpu_loras 4 = 8 placements; 6 adapters on one replica each fit,
    # though 6 is above one replica's 4.
    from tests.support.fleet import served_adapters_clone

    others = served_adapters_clone(deployment, approved_v1, 5, prefix="bounded")
    ServedAdapter.objects.filter(pk__in=[s.pk for s in others]).update(max_replicas=1)
    ServedAdapter.objects.create(deployment=deployment, adapter=contracts, max_replicas=1)

    host = checks(evaluate_gate(deployment, approved_v1))["host_cache"]

    assert host.ok, host.message
    assert host.message == (
        "6 placements needed, 8 in the host caches of 2 replica(s) x max_cpu_loras 4: "
        "every one has room."
    )


def test_a_bounded_adapter_with_no_room_is_refused(
    lena, alex, legal, deployment, contracts, approved_v1
):
    from tests.support.fleet import served_adapters_clone

    # 4 adapters without bounds fill both replicas' host caches (4 each).
    served_adapters_clone(deployment, approved_v1, 4, prefix="everywhere")
    ServedAdapter.objects.create(deployment=deployment, adapter=contracts, max_replicas=1)

    report = evaluate_gate(deployment, approved_v1)

    host = checks(report)["host_cache"]
    assert not host.ok and not host.advisory
    assert "9 placements needed, 8 in the host caches of 2 replica(s)" in host.message
    assert "no room" in host.message
    assert not report.passed
