"""Gateway API Inference Extension resources: what a deployment renders is
valid under the upstream CRD schemas vendored in deploy/crds/ (checked with
jsonschema, strict: a field the CRD does not define fails), one InferencePool,
one InferenceObjective and one InferenceModelRewrite per promoted adapter, and
the KServe export beside it still renders."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from serving.door.inference_extension import manifests, pod_labels, render_yaml
from serving.kserve import manifests as kserve_manifests
from serving.rollouts.engine import rollout_execute
from serving.services.deployments import deployment_update
from serving.services.promotions import promotion_create
from tests.conftest import actor
from tests.factories import make_adapter, make_approved_version
from tests.support import crd_schemas

pytestmark = pytest.mark.django_db

CRDS = (
    Path(__file__).resolve().parents[2]
    / "deploy/crds/gateway-api-inference-extension/v1.5.0-df9f8909fe06fe2dfd4a6fc0bd0c01a0acabf849"
)


SCHEMAS = crd_schemas.load(CRDS)


def problems(resource: dict) -> list[str]:
    return crd_schemas.problems(SCHEMAS, resource)


def promote(user, deployment, version) -> None:
    promotion = promotion_create(actor=actor(user), deployment=deployment, version=version)
    assert rollout_execute(promotion.rollouts.get().pk, "w") == "succeeded"


@pytest.fixture
def served(lena, alex, root, deployment, fake_replicas, contracts, approved_v1):
    deployment = deployment_update(
        actor=actor(root),
        deployment=deployment,
        kubernetes_namespace="ai-inference",
        kubernetes_label_selector="serving.kserve.io/inferenceservice=staging-cpu,tier=gpu",
        kubernetes_service_name="staging-cpu-predictor",
        base_model_pvc="pvc-tiny-llama",
        adapter_pvc="pvc-lora-adapters-shared",
        replica_urls=[],
    )
    from serving.models import Replica

    for fake in fake_replicas:
        Replica.objects.create(deployment=deployment, base_url=fake.base_url)
    promote(lena, deployment, approved_v1)
    memos = make_adapter(lena, contracts.department, name="memos", served_name="Legal_Memos.v2")
    promote(lena, deployment, make_approved_version(lena, alex, memos))
    return deployment


def test_the_vendored_crds_are_the_three_kinds_rendered():
    assert set(SCHEMAS) == {
        ("inference.networking.k8s.io/v1", "InferencePool"),
        ("inference.networking.x-k8s.io/v1alpha2", "InferenceObjective"),
        ("inference.networking.x-k8s.io/v1alpha2", "InferenceModelRewrite"),
    }


def test_a_deployment_renders_a_pool_and_per_adapter_objective_and_rewrite(served):
    resources = manifests(served)
    for resource in resources:
        assert problems(resource) == [], resource
    kinds = [(r["kind"], r["metadata"]["name"]) for r in resources]
    assert kinds[0] == ("InferencePool", "staging-cpu-pool")
    assert sorted(kinds[1:]) == [
        ("InferenceModelRewrite", "legal-contracts"),
        ("InferenceModelRewrite", "legal-memos.v2"),
        ("InferenceObjective", "legal-contracts"),
        ("InferenceObjective", "legal-memos.v2"),
    ]
    pool = resources[0]
    assert pool["metadata"]["namespace"] == "ai-inference"
    assert pool["spec"]["selector"]["matchLabels"] == {
        "serving.kserve.io/inferenceservice": "staging-cpu",
        "tier": "gpu",
    }
    rewrite = next(
        r["spec"]["rules"][0]
        for r in resources
        if r["kind"] == "InferenceModelRewrite" and r["metadata"]["name"] == "legal-memos.v2"
    )
    # The stable name clients send, exactly, and the name vLLM serves it under.
    assert rewrite["matches"] == [{"model": {"type": "Exact", "value": "Legal_Memos.v2"}}]
    assert rewrite["targets"] == [{"modelRewrite": "Legal_Memos.v2", "weight": 100}]
    assert "kind: InferenceModelRewrite" in render_yaml(served)
    # The KServe export of the same deployment still renders.
    assert [m["kind"] for m in kserve_manifests(served)] == [
        "ServingRuntime",
        "InferenceService",
        "NetworkPolicy",
    ]


def test_canary_weights_render_as_a_split_of_the_stable_name(served):
    split = [("legal-contracts", 90), ("legal-contracts-v2", 10)]
    resources = manifests(served, splits={"legal-contracts": split})
    rewrite = next(
        r
        for r in resources
        if r["kind"] == "InferenceModelRewrite" and r["metadata"]["name"] == "legal-contracts"
    )
    assert problems(rewrite) == []
    assert rewrite["spec"]["rules"][0]["targets"] == [
        {"modelRewrite": "legal-contracts", "weight": 90},
        {"modelRewrite": "legal-contracts-v2", "weight": 10},
    ]


def test_the_schemas_catch_what_a_cluster_would_refuse(served):
    resources = manifests(served)
    pool = resources[0]
    objective = next(r for r in resources if r["kind"] == "InferenceObjective")
    rewrite = next(r for r in resources if r["kind"] == "InferenceModelRewrite")
    broken_pool = copy.deepcopy(pool)
    broken_pool["spec"]["targetPorts"] = [{"number": 70000}]
    assert any("70000" in p for p in problems(broken_pool))
    broken_rewrite = copy.deepcopy(rewrite)
    broken_rewrite["spec"]["rules"][0]["targets"][0]["weight"] = 0
    assert problems(broken_rewrite)
    typo = copy.deepcopy(objective)
    typo["spec"]["priorty"] = 1
    assert any("priorty" in p for p in problems(typo))


def test_a_set_based_selector_cannot_become_a_pool(deployment):
    deployment.kubernetes_label_selector = "tier in (gpu)"
    with pytest.raises(ValueError, match="equality only"):
        pod_labels(deployment)
    deployment.kubernetes_label_selector = ""
    assert pod_labels(deployment) == {"serving.kserve.io/inferenceservice": deployment.name}
