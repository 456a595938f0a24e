"""Gateway API Inference Extension resources for a deployment, for clusters
whose front door is an inference gateway (Envoy Gateway, GKE, Istio, kgateway,
llm-d) instead of the HAProxy this product runs itself:

- one InferencePool (inference.networking.k8s.io/v1) selecting the replicas' pods;
- one InferenceObjective (inference.networking.x-k8s.io/v1alpha2) per adapter;
- one InferenceModelRewrite (v1alpha2) per adapter: its stable name, the one
  clients send, to the names vLLM serves, with weights. Today every adapter's
  stable name is its vLLM name (weight 100); `splits` carries a canary's shares.

Schemas: GIE v1.5.0, the last release that still defines InferenceObjective and
InferenceModelRewrite; v1.6.0 keeps only InferencePool and moved the other two to
llm-d/llm-d-router. The CRDs are vendored in deploy/crds/ and the tests validate
what this renders against them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import yaml

from serving.kserve import PORT, promoted
from serving.models import Deployment

POOL_API = "inference.networking.k8s.io/v1"
ALPHA_API = "inference.networking.x-k8s.io/v1alpha2"
# The port of the endpoint picker (EPP) the gateway asks which pod gets a request.
EPP_PORT = 9002


def pool_name(deployment: Deployment) -> str:
    return f"{deployment.name}-pool"


def _dns_label(name: str) -> str:
    """A served name as a Kubernetes object name (lower case, [a-z0-9-.])."""
    cleaned = re.sub(r"[^a-z0-9.-]+", "-", name.lower()).strip("-.")
    return cleaned[:253] or "adapter"


def pod_labels(deployment: Deployment) -> dict[str, str]:
    """The pods of the pool: the deployment's own selector when discovery uses
    one (equality terms only, as InferencePool's matchLabels), else the label
    KServe puts on the InferenceService's pods (serving/kserve.py)."""
    selector = deployment.kubernetes_label_selector.strip()
    if not selector:
        return {"serving.kserve.io/inferenceservice": deployment.name}
    labels = {}
    for term in selector.split(","):
        key, sep, value = term.partition("=")
        if not sep or key.endswith("!"):
            raise ValueError(
                f"selector term {term!r}: an InferencePool selects by equality only (key=value)"
            )
        labels[key.strip()] = value.lstrip("=").strip()
    return labels


def _metadata(deployment: Deployment, name: str) -> dict:
    metadata = {
        "name": name,
        "labels": {"app.kubernetes.io/managed-by": "lora-adapter-registry"},
    }
    if deployment.kubernetes_namespace:
        metadata["namespace"] = deployment.kubernetes_namespace
    return metadata


def manifests(
    deployment: Deployment,
    *,
    splits: Mapping[str, Sequence[tuple[str, int]]] | None = None,
) -> list[dict]:
    """[InferencePool, then per adapter an InferenceObjective and an
    InferenceModelRewrite]. `splits`: stable name -> [(vLLM name, weight)]
    for adapters whose traffic is split (a canary); the rest get all of it."""
    splits = splits or {}
    pool = pool_name(deployment)
    pool_ref = {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": pool}
    out = [
        {
            "apiVersion": POOL_API,
            "kind": "InferencePool",
            "metadata": _metadata(deployment, pool),
            "spec": {
                "selector": {"matchLabels": pod_labels(deployment)},
                "targetPorts": [{"number": PORT}],
                "endpointPickerRef": {
                    "name": f"{pool}-epp",
                    "port": {"number": EPP_PORT},
                    # A request the picker cannot place is refused, never sent to
                    # a pod that may lack its adapter.
                    "failureMode": "FailClose",
                },
            },
        }
    ]
    for served in promoted(deployment):
        name = served.adapter.served_name
        targets = splits.get(name) or [(name, 100)]
        out.append(
            {
                "apiVersion": ALPHA_API,
                "kind": "InferenceObjective",
                "metadata": _metadata(deployment, _dns_label(name)),
                "spec": {"poolRef": pool_ref, "priority": 0},
            }
        )
        out.append(
            {
                "apiVersion": ALPHA_API,
                "kind": "InferenceModelRewrite",
                "metadata": _metadata(deployment, _dns_label(name)),
                "spec": {
                    "poolRef": pool_ref,
                    "rules": [
                        {
                            "matches": [{"model": {"type": "Exact", "value": name}}],
                            "targets": [
                                {"modelRewrite": target, "weight": weight}
                                for target, weight in targets
                            ],
                        }
                    ],
                },
            }
        )
    return out


def render_yaml(deployment: Deployment) -> str:
    header = (
        f"# Gateway API Inference Extension resources for deployment {deployment.name},\n"
        "# rendered by the LoRA adapter registry. Re-render after promotions.\n"
    )
    return header + yaml.safe_dump_all(manifests(deployment), sort_keys=False)
