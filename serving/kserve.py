"""KServe manifests for a deployment that carry what is promoted.

vLLM keeps nothing across a restart: a pod comes back with only its
`--lora-modules`. Rendering every promoted adapter into the ServingRuntime's
args (at its immutable, versioned staged path) means a restarted pod serves
the promoted set before the reconcile reaches it; the reconcile then only
confirms. Re-render and re-apply after promotions to keep the two close.
Adapters with placement bounds follow placement instead (see lora_modules).

The shape follows the product document's servingruntime-vllm-multilora.yaml,
minus `--lora-extra-vocab-size`, which vLLM removed (passing it fails start-up).

Every replica exports its requests' token counts (`--otlp-traces-endpoint`) to
the control plane's web Service, with the deployment's metering token from the
Secret `<deployment>-metering-token` (`manage.py metering_token <deployment>`):
without it nothing is metered (docs/operators/usage.md). The replicas are
cluster-local, and a NetworkPolicy lets only the pods that call them (the
doors, and the rollouts and reconcile workers that load adapters and read
/metrics) reach them: a pod calling a replica directly would skip keys and
grants and choose its own request id.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import yaml
from django.conf import settings
from django.http import HttpResponse

from core.errors import Conflict
from registry.models import AdapterVersion
from serving.models import Deployment, ServedAdapter
from serving.rules.placement_plan import placed_keys
from serving.volume import serve_path_for

MODEL_MOUNT = "/mnt/models"
PORT = 8000
# The label of the control plane's pods that call replicas: the doors and the
# rollouts and reconcile workers, each in Deployments of their own
# (deploy/kustomize/base/gateway.yaml, workers.yaml).
REPLICA_CLIENT_LABEL = {"lora-adapter-registry/calls-replicas": "true"}
WEB_SERVICE = "lora-registry-web"
WEB_PORT = 8000
DEFAULT_RESOURCES = {
    "requests": {"cpu": "4", "memory": "16Gi"},
    "limits": {"cpu": "8", "memory": "32Gi"},
}


def runtime_name(deployment: Deployment) -> str:
    return f"{deployment.name}-vllm-multilora"


def promoted(deployment: Deployment) -> list[ServedAdapter]:
    return list(
        ServedAdapter.objects.filter(deployment=deployment, version__isnull=False)
        .select_related("adapter", "version__adapter__department")
        .order_by("adapter__served_name")
    )


def _version(served: ServedAdapter) -> AdapterVersion:
    assert served.version is not None  # promoted() reads only rows that serve one
    return served.version


def lora_modules(deployment: Deployment, served: list[ServedAdapter]) -> list[dict]:
    """One {"name", "path", "base_model_name"} per promoted adapter that is on
    every replica. Every pod of a ServingRuntime gets the same args, so an
    adapter with placement bounds (serving.rules.placement_plan) is left out: the control
    plane loads it at run time on the replicas placement puts it on, and a
    restarted pod must not load it everywhere (past its host cache)."""
    return [
        {
            "name": s.adapter.served_name,
            "path": s.served_path or serve_path_for(deployment, _version(s)),
            "base_model_name": deployment.base_model_name,
        }
        for s in served
        if placed_keys(s) is None
    ]


def placed_at_run_time(served: list[ServedAdapter]) -> list[str]:
    """The promoted adapters placement puts on some replicas only."""
    return [s.adapter.served_name for s in served if placed_keys(s) is not None]


def metering_token_secret(deployment: Deployment) -> str:
    return f"{deployment.name}-metering-token"


def otlp_endpoint(deployment: Deployment) -> str:
    """The OTLP receiver of the deployment, as its pods reach it in the cluster."""
    namespace = settings.KSERVE_CONTROL_PLANE_NAMESPACE
    return f"http://{WEB_SERVICE}.{namespace}.svc:{WEB_PORT}/otlp/{deployment.name}/v1/traces"


def vllm_args(deployment: Deployment, served: list[ServedAdapter]) -> list[str]:
    args = [
        f"--model={MODEL_MOUNT}",
        f"--served-model-name={deployment.base_model_name}",
        f"--port={PORT}",
        "--enable-lora",
        f"--max-loras={deployment.max_loras}",
        f"--max-cpu-loras={deployment.max_cpu_loras}",
        f"--max-lora-rank={deployment.max_lora_rank}",
        f"--gpu-memory-utilization={deployment.gpu_memory_utilization:.2f}",
        # Every stream ends with a usage chunk, whatever the client asked (metering).
        "--enable-force-include-usage",
        # One span per request, with its tokens, to the control plane (metering).
        f"--otlp-traces-endpoint={otlp_endpoint(deployment)}",
    ]
    if deployment.max_model_len:
        args.append(f"--max-model-len={deployment.max_model_len}")
    modules = lora_modules(deployment, served)
    if modules:
        # Last: the option takes every following argument up to the next flag.
        args.append("--lora-modules")
        args += [json.dumps(m, separators=(",", ":")) for m in modules]
    return args


def _resources(deployment: Deployment) -> dict:
    resources = copy.deepcopy(DEFAULT_RESOURCES)
    for part in ("requests", "limits"):
        resources[part].update((deployment.runtime_resources or {}).get(part, {}))
        if deployment.gpus:
            resources[part]["nvidia.com/gpu"] = str(deployment.gpus)
    return resources


def _health_probe(*, period: int, failures: int) -> dict:
    return {
        "httpGet": {"path": "/health", "port": PORT},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def _metadata(deployment: Deployment, name: str) -> dict:
    metadata = {
        "name": name,
        "labels": {
            "opendatahub.io/dashboard": "true",
            "app.kubernetes.io/managed-by": "lora-adapter-registry",
        },
    }
    if deployment.kubernetes_namespace:
        metadata["namespace"] = deployment.kubernetes_namespace
    return metadata


def missing_settings(deployment: Deployment) -> list[str]:
    return [name for name in ("base_model_pvc", "adapter_pvc") if not getattr(deployment, name)]


def manifests(deployment: Deployment) -> list[dict]:
    """[ServingRuntime, InferenceService] as plain dicts."""
    missing = missing_settings(deployment)
    if missing:
        raise Conflict(
            f"Set {' and '.join(missing)} on deployment {deployment.name} to render its "
            "KServe manifests (the claims of the base-model and adapter volumes).",
            code="kserve_incomplete",
        )
    served = promoted(deployment)
    env: list[dict[str, object]] = [
        # The control plane pushes new versions at runtime; without this vLLM has no load route.
        {"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "True"},
        {"name": "HF_HUB_OFFLINE", "value": "1"},
    ]
    if deployment.vllm_api_key:
        # The key itself is never rendered: it lives in a Secret the cluster already has.
        env.append(
            {
                "name": "VLLM_API_KEY",
                "valueFrom": {
                    "secretKeyRef": {"name": f"{deployment.name}-vllm-api-key", "key": "api-key"}
                },
            }
        )
    env += [
        # The token is never rendered: the Secret holds it; Kubernetes puts it into
        # the exporter's header ($(VAR) refers to a variable defined above it).
        {
            "name": "METERING_TOKEN",
            "valueFrom": {
                "secretKeyRef": {"name": metering_token_secret(deployment), "key": "token"}
            },
        },
        {
            "name": "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            "value": "authorization=Bearer%20$(METERING_TOKEN)",
        },
        # vLLM's exporter speaks gRPC unless told; the receiver is OTLP/HTTP protobuf.
        {"name": "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "value": "http/protobuf"},
        # As scripts/vllm/serve.sh: a batch leaves within 1 s, a receiver away is
        # retried for 60 s, and 16384 finished requests may wait meanwhile.
        {"name": "OTEL_BSP_SCHEDULE_DELAY", "value": "1000"},
        {"name": "OTEL_BSP_MAX_QUEUE_SIZE", "value": "16384"},
        {"name": "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "value": "60"},
    ]
    runtime = {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "ServingRuntime",
        "metadata": _metadata(deployment, runtime_name(deployment)),
        "spec": {
            "annotations": {
                "prometheus.io/path": "/metrics",
                "prometheus.io/port": str(PORT),
                "prometheus.io/scrape": "true",
            },
            "multiModel": False,
            "supportedModelFormats": [{"name": "vLLM", "version": "1", "autoSelect": True}],
            "containers": [
                {
                    "name": "kserve-container",
                    "image": deployment.runtime_image or settings.KSERVE_VLLM_IMAGE,
                    "command": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
                    "args": vllm_args(deployment, served),
                    "env": env,
                    "ports": [{"containerPort": PORT, "name": "http1", "protocol": "TCP"}],
                    # Ready only once vLLM answers: the endpoint turning ready is
                    # what makes the control plane reconcile the new pod.
                    "startupProbe": _health_probe(period=10, failures=90),
                    "readinessProbe": _health_probe(period=5, failures=3),
                    "livenessProbe": _health_probe(period=30, failures=5),
                    "resources": _resources(deployment),
                    "volumeMounts": [
                        {"name": "base-model", "mountPath": MODEL_MOUNT, "readOnly": True},
                        {
                            "name": "lora-adapters",
                            "mountPath": deployment.volume_serve_path,
                            "readOnly": True,
                        },
                        {"name": "shm", "mountPath": "/dev/shm"},
                    ],
                }
            ],
            "volumes": [
                {
                    "name": "base-model",
                    "persistentVolumeClaim": {
                        "claimName": deployment.base_model_pvc,
                        "readOnly": True,
                    },
                },
                {
                    "name": "lora-adapters",
                    "persistentVolumeClaim": {
                        "claimName": deployment.adapter_pvc,
                        "readOnly": True,
                    },
                },
                # vLLM's workers share tensors through /dev/shm; the default 64 MiB is too small.
                {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}},
            ],
        },
    }
    service_metadata = _metadata(deployment, deployment.name)
    # No route from outside the cluster (KServe's label; Knative's for a
    # serverless install): clients go through the front door.
    service_metadata["labels"]["networking.kserve.io/visibility"] = "cluster-local"
    service_metadata["labels"]["networking.knative.dev/visibility"] = "cluster-local"
    service: dict[str, Any] = {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": service_metadata,
        "spec": {
            "predictor": {
                "minReplicas": 1,
                "model": {"modelFormat": {"name": "vLLM"}, "runtime": runtime_name(deployment)},
            }
        },
    }
    # Each pod is its own adapter registry: plain Deployments (no scale to zero,
    # no activator between the control plane and a pod) keep every pod addressable.
    service["metadata"]["annotations"] = {"serving.kserve.io/deploymentMode": "RawDeployment"}
    placed = placed_at_run_time(served)
    if placed:
        # Said where the next person applying this looks: these are not in the args.
        service["metadata"]["annotations"]["lora-adapter-registry/placed-at-run-time"] = ",".join(
            placed
        )
    return [runtime, service, network_policy(deployment)]


def network_policy(deployment: Deployment) -> dict:
    """Only the pods that call replicas reach them (KServe labels each pod
    with its InferenceService): the doors for clients, and the workers that
    load adapters and read /metrics. Kubelet's probes are not subject to it.
    A Prometheus that scrapes the replicas needs a rule of its own."""
    control_plane = {"kubernetes.io/metadata.name": settings.KSERVE_CONTROL_PLANE_NAMESPACE}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(deployment, f"{deployment.name}-replicas"),
        "spec": {
            "podSelector": {"matchLabels": {"serving.kserve.io/inferenceservice": deployment.name}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [
                        {
                            "namespaceSelector": {"matchLabels": control_plane},
                            "podSelector": {"matchLabels": dict(REPLICA_CLIENT_LABEL)},
                        }
                    ],
                    "ports": [{"port": PORT, "protocol": "TCP"}],
                }
            ],
        },
    }


def render_yaml(deployment: Deployment) -> str:
    header = (
        f"# KServe manifests for deployment {deployment.name}, rendered by the LoRA adapter\n"
        "# registry with every promoted adapter that is on every replica in --lora-modules\n"
        "# (adapters with placement bounds are loaded at run time where they are placed).\n"
        "# Re-render after promotions. The replicas meter tokens with the Secret\n"
        f"# {metering_token_secret(deployment)} (key `token`: manage.py metering_token "
        f"{deployment.name}).\n"
    )
    return header + yaml.safe_dump_all(manifests(deployment), sort_keys=False)


def yaml_download(text: str, deployment: Deployment) -> HttpResponse:
    response = HttpResponse(text, content_type="application/yaml; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{deployment.name}-kserve.yaml"'
    return response
