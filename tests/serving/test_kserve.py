"""KServe manifests carry every promoted adapter; who may download them.
A real vLLM started from the rendered args: tests/serving/vllm/test_kserve_real.py."""

from __future__ import annotations

import json
from io import StringIO

import pytest
import yaml
from django.core.management import CommandError, call_command

from serving.kserve import manifests
from serving.rollouts.engine import rollout_execute
from serving.services.deployments import deployment_update
from serving.services.promotions import promotion_create, retire
from tests.conftest import actor
from tests.factories import make_adapter, make_approved_version
from tests.serving.kserve_schema import kserve_problems

pytestmark = pytest.mark.django_db


def promote(user, deployment, version) -> str:
    promotion = promotion_create(actor=actor(user), deployment=deployment, version=version)
    rollout = promotion.rollouts.get()
    assert rollout_execute(rollout.pk, "w") == "succeeded"
    rollout.refresh_from_db()
    return rollout.served_path


@pytest.fixture
def cluster_ready(root, deployment):
    return deployment_update(
        actor=actor(root),
        deployment=deployment,
        base_model_pvc="pvc-tiny-llama",
        adapter_pvc="pvc-lora-adapters-shared",
        kubernetes_namespace="ai-inference",
        kubernetes_label_selector="serving.kserve.io/inferenceservice=staging-cpu",
        kubernetes_service_name="staging-cpu-predictor",
        replica_urls=[],
    )


@pytest.fixture
def promoted(lena, alex, cluster_ready, fake_replicas, contracts, approved_v1, approved_v2):
    # Replicas come from the watch in production; here the fakes are registered by hand.
    from serving.models import Replica

    for fake in fake_replicas:
        Replica.objects.create(deployment=cluster_ready, base_url=fake.base_url)
    first = promote(lena, cluster_ready, approved_v1)
    swapped = promote(lena, cluster_ready, approved_v2)
    memos = make_adapter(lena, contracts.department, name="memos", served_name="legal-memos")
    memo_path = promote(lena, cluster_ready, make_approved_version(lena, alex, memos))
    return {"legal-contracts": swapped, "legal-memos": memo_path, "first": first}


def runtime_and_service(deployment):
    runtime, service, _policy = manifests(deployment)
    return runtime, service, runtime["spec"]["containers"][0]


def modules(args: list[str]) -> list[dict]:
    start = args.index("--lora-modules") + 1
    return [json.loads(a) for a in args[start:] if not a.startswith("--")]


def test_the_runtime_carries_every_promoted_adapter_at_its_versioned_path(cluster_ready, promoted):
    runtime, service, container = runtime_and_service(cluster_ready)
    args = container["args"]
    assert modules(args) == [
        {
            "name": "legal-contracts",
            "path": promoted["legal-contracts"],
            "base_model_name": "tiny-llama",
        },
        {"name": "legal-memos", "path": promoted["legal-memos"], "base_model_name": "tiny-llama"},
    ]
    assert promoted["legal-contracts"] != promoted["first"]  # the swap's new, immutable path
    volume = cluster_ready.volume_serve_path
    assert promoted["legal-contracts"].startswith(f"{volume}/legal/contracts/v2-")
    for flag in (
        "--enable-lora",
        "--max-loras=2",
        "--max-cpu-loras=4",
        "--max-lora-rank=16",
        "--served-model-name=tiny-llama",
        "--gpu-memory-utilization=0.90",
        "--model=/mnt/models",
        "--enable-force-include-usage",
    ):
        assert flag in args
    assert not any("lora-extra-vocab-size" in a for a in args)
    assert args[-3] == "--lora-modules"  # last, so its items end the argument list


def test_mounts_annotations_and_resources(cluster_ready, promoted):
    runtime, service, container = runtime_and_service(cluster_ready)
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["base-model"] == {
        "name": "base-model",
        "mountPath": "/mnt/models",
        "readOnly": True,
    }
    assert mounts["lora-adapters"]["mountPath"] == cluster_ready.volume_serve_path
    assert mounts["lora-adapters"]["readOnly"] is True
    claims = {v["name"]: v.get("persistentVolumeClaim") for v in runtime["spec"]["volumes"]}
    assert claims["base-model"] == {"claimName": "pvc-tiny-llama", "readOnly": True}
    assert claims["lora-adapters"] == {"claimName": "pvc-lora-adapters-shared", "readOnly": True}
    assert runtime["spec"]["annotations"] == {
        "prometheus.io/path": "/metrics",
        "prometheus.io/port": "8000",
        "prometheus.io/scrape": "true",
    }
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "1"
    env = {e["name"]: e for e in container["env"]}
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"]["value"] == "True"
    # The pod turns ready (and is reconciled) only once vLLM answers.
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": 8000}
    assert runtime["metadata"]["namespace"] == service["metadata"]["namespace"] == "ai-inference"
    assert service["spec"]["predictor"]["model"]["runtime"] == runtime["metadata"]["name"]
    # The discovery selector finds this InferenceService's pods.
    assert service["metadata"]["name"] == "staging-cpu"


def test_both_objects_have_only_fields_kserve_defines(cluster_ready, promoted):
    for obj in manifests(cluster_ready):
        assert kserve_problems(obj) == []


def test_the_check_catches_what_kserve_would_refuse(cluster_ready, promoted):
    runtime, service, _policy = manifests(cluster_ready)
    runtime["spec"]["loraModules"] = []
    runtime["spec"]["containers"][0]["resources"]["limits"]["cpu"] = {"many": 1}
    service["spec"]["predictor"]["model"].pop("modelFormat")
    problems = kserve_problems(runtime)
    assert len(problems) == 2
    assert problems[0] == "spec.loraModules: not a field KServe defines"
    assert "resources" in problems[1] and "limits" in problems[1]
    assert kserve_problems(service) == ["predictor.model.modelFormat: required"]


def test_retired_adapters_leave_the_manifest_and_an_api_key_is_a_secret_reference(
    root, lena, cluster_ready, promoted, contracts
):
    rollout = retire(actor=actor(lena), deployment=cluster_ready, adapter=contracts)
    assert rollout_execute(rollout.pk, "w") == "succeeded"
    deployment_update(actor=actor(root), deployment=cluster_ready, vllm_api_key="sk-very-secret")
    _, _, container = runtime_and_service(cluster_ready)
    assert [m["name"] for m in modules(container["args"])] == ["legal-memos"]
    text = json.dumps(container)
    assert "sk-very-secret" not in text
    env = {e["name"]: e for e in container["env"]}
    assert env["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "staging-cpu-vllm-api-key"


def test_without_adapters_there_is_no_lora_modules_flag(cluster_ready):
    _, _, container = runtime_and_service(cluster_ready)
    assert "--lora-modules" not in container["args"]
    assert "--enable-lora" in container["args"]


# --- the download -------------------------------------------------------------


def url(deployment):
    return f"/api/v1/deployments/{deployment.name}/kserve/"


def test_a_platform_admin_downloads_yaml(as_root, cluster_ready, promoted):
    response = as_root.get(url(cluster_ready))
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/yaml")
    assert 'filename="staging-cpu-kserve.yaml"' in response["Content-Disposition"]
    docs = list(yaml.safe_load_all(response.content))
    assert [d["kind"] for d in docs] == ["ServingRuntime", "InferenceService", "NetworkPolicy"]
    assert docs == manifests(cluster_ready)


@pytest.mark.parametrize("caller", ["as_lena", "as_token", "as_fred", "as_alex"])
def test_only_platform_admins_get_the_manifests_they_name_volumes_and_namespace(
    request, caller, cluster_ready, promoted
):
    # Issue 21: a member whose departments covered every adapter got the volume's host path.
    response = request.getfixturevalue(caller).get(url(cluster_ready))
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "kserve_forbidden"
    for infrastructure in (b"legal-contracts", b"claimName", b"/mnt"):
        assert infrastructure not in response.content


def test_a_department_not_allowed_on_the_deployment_is_refused(root, as_fred, cluster_ready, legal):
    deployment_update(actor=actor(root), deployment=cluster_ready, allowed_departments=[legal])
    # Outsiders are not told the deployment exists.
    assert as_fred.get(url(cluster_ready)).status_code == 404


def test_anonymous_and_unknown(anonymous, as_root, cluster_ready):
    assert anonymous.get(url(cluster_ready)).status_code in (401, 403)
    assert as_root.get("/api/v1/deployments/nope/kserve/").status_code == 404


def test_a_deployment_without_volume_claims_says_what_is_missing(as_root, deployment):
    response = as_root.get(url(deployment))
    assert response.status_code == 409
    assert "base_model_pvc and adapter_pvc" in response.json()["error"]["message"]


def test_the_deployment_page_links_the_download(root, lena, fred, cluster_ready, promoted):
    from tests.conftest import client_for

    page = client_for(root).get(f"/deployments/{cluster_ready.name}/")
    assert b'data-testid="kserve-download"' in page.content
    member = client_for(lena)
    assert (
        b'data-testid="kserve-download"'
        not in member.get(f"/deployments/{cluster_ready.name}/").content
    )
    assert member.get(f"/deployments/{cluster_ready.name}/kserve.yaml").status_code == 403
    download = client_for(root).get(f"/deployments/{cluster_ready.name}/kserve.yaml")
    assert download.status_code == 200
    assert list(yaml.safe_load_all(download.content)) == manifests(cluster_ready)
    outsider = client_for(fred)
    assert (
        b'data-testid="kserve-download"'
        not in outsider.get(f"/deployments/{cluster_ready.name}/").content
    )
    assert outsider.get(f"/deployments/{cluster_ready.name}/kserve.yaml").status_code == 403


def test_the_export_command_prints_the_same_yaml(cluster_ready, promoted):
    out = StringIO()
    call_command("export_kserve", cluster_ready.name, stdout=out)
    assert list(yaml.safe_load_all(out.getvalue())) == manifests(cluster_ready)
    with pytest.raises(CommandError, match="No deployment"):
        call_command("export_kserve", "nope")


def test_resources_can_be_overridden_and_bad_shapes_are_refused(root, cluster_ready):
    from core.errors import ValidationFailed

    deployment_update(
        actor=actor(root),
        deployment=cluster_ready,
        runtime_resources={"requests": {"memory": "24Gi"}},
        gpus=2,
    )
    _, _, container = runtime_and_service(cluster_ready)
    assert container["resources"]["requests"]["memory"] == "24Gi"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    with pytest.raises(ValidationFailed, match="runtime_resources"):
        deployment_update(
            actor=actor(root), deployment=cluster_ready, runtime_resources={"cpu": "4"}
        )


def test_an_adapter_with_placement_bounds_is_left_to_placement(cluster_ready, promoted):
    from serving.models import ServedAdapter

    ServedAdapter.objects.filter(
        deployment=cluster_ready, adapter__served_name="legal-memos"
    ).update(max_replicas=1)

    runtime, service, container = runtime_and_service(cluster_ready)

    # Every pod gets the same args: one placed on some replicas only is not in them.
    assert [m["name"] for m in modules(container["args"])] == ["legal-contracts"]
    annotations = service["metadata"]["annotations"]
    assert annotations["lora-adapter-registry/placed-at-run-time"] == "legal-memos"


# --- every token metered, and nobody but the door reaches a replica (issue 43) --


def test_the_runtime_exports_every_request_s_tokens_with_the_deployment_s_token(
    cluster_ready, settings
):
    """Without the span exporter nothing is metered; the token is a Secret
    reference that Kubernetes puts into the exporter's header, never the value."""
    settings.KSERVE_CONTROL_PLANE_NAMESPACE = "registry-ns"
    _, _, container = runtime_and_service(cluster_ready)
    endpoint = "http://lora-registry-web.registry-ns.svc:8000/otlp/staging-cpu/v1/traces"
    assert f"--otlp-traces-endpoint={endpoint}" in container["args"]
    assert "--enable-force-include-usage" in container["args"]
    env = [e["name"] for e in container["env"]]
    by_name = {e["name"]: e for e in container["env"]}
    assert by_name["METERING_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "staging-cpu-metering-token",
        "key": "token",
    }
    # $(METERING_TOKEN) is expanded only from a variable defined before it.
    assert env.index("METERING_TOKEN") < env.index("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
    assert by_name["OTEL_EXPORTER_OTLP_TRACES_HEADERS"]["value"] == (
        "authorization=Bearer%20$(METERING_TOKEN)"
    )
    assert by_name["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"]["value"] == "http/protobuf"
    from observability.otlp import metering_token

    assert metering_token("staging-cpu") not in json.dumps(manifests(cluster_ready))


def test_replicas_are_cluster_local_and_only_the_pods_that_call_them_reach_them(
    cluster_ready, settings
):
    """Any pod calling a replica directly would skip keys and grants and choose
    the request id metering believes."""
    settings.KSERVE_CONTROL_PLANE_NAMESPACE = "registry-ns"
    runtime, service, policy = manifests(cluster_ready)
    labels = service["metadata"]["labels"]
    assert labels["networking.kserve.io/visibility"] == "cluster-local"
    assert labels["networking.knative.dev/visibility"] == "cluster-local"
    assert policy["kind"] == "NetworkPolicy"
    assert policy["metadata"]["namespace"] == "ai-inference"
    spec = policy["spec"]
    # The selector the discovery uses finds the same pods.
    assert spec["podSelector"] == {
        "matchLabels": {"serving.kserve.io/inferenceservice": "staging-cpu"}
    }
    assert spec["policyTypes"] == ["Ingress"]
    (rule,) = spec["ingress"]
    assert rule["from"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "registry-ns"}},
            "podSelector": {"matchLabels": {"lora-adapter-registry/calls-replicas": "true"}},
        }
    ]
    assert rule["ports"] == [{"port": 8000, "protocol": "TCP"}]
    assert kserve_problems(policy) == []
