"""What KServe's CRDs define, for checking rendered manifests without a cluster.

Field lists copied from KServe's config/crd/full/serving.kserve.io_servingruntimes.yaml
(v1alpha1) and serving.kserve.io_inferenceservices.yaml (v1beta1), August 2026.
The containers and volumes inside are core Kubernetes types: they are checked
with kubernetes-validate as a Pod.
"""

from __future__ import annotations

import kubernetes_validate

SERVING_RUNTIME_SPEC = {
    "affinity", "annotations", "builtInAdapter", "containers", "disabled", "grpcDataEndpoint",
    "grpcEndpoint", "hostIPC", "httpDataEndpoint", "imagePullSecrets", "labels", "multiModel",
    "nodeSelector", "protocolVersions", "replicas", "resourceClaims", "schedulerName",
    "storageHelper", "supportedModelFormats", "tolerations", "volumes", "workerSpec",
}  # fmt: skip
SERVING_RUNTIME_REQUIRED = {"containers"}
SUPPORTED_MODEL_FORMAT = {"autoSelect", "name", "priority", "version"}
INFERENCE_SERVICE_SPEC = {"canary", "explainer", "predictor", "transformer"}
PREDICTOR = {
    "activeDeadlineSeconds", "affinity", "annotations", "autoScaling",
    "automountServiceAccountToken", "batcher", "canaryTrafficPercent", "containerConcurrency",
    "containers", "deploymentStrategy", "dnsConfig", "dnsPolicy", "enableServiceLinks",
    "hostAliases", "hostIPC", "hostNetwork", "hostPID", "hostUsers", "hostname",
    "hostnameOverride", "huggingface", "imagePullSecrets", "initContainers", "labels", "lightgbm",
    "logger", "maxReplicas", "minReplicas", "model", "name", "nodeName", "nodeSelector", "onnx",
    "os", "overhead", "paddle", "pmml", "preemptionPolicy", "priority", "priorityClassName",
    "pytorch", "readinessGates", "resourceClaims", "resources", "restartPolicy",
    "runtimeClassName", "scaleMetric", "scaleMetricType", "scaleTarget", "schedulerName",
    "schedulingGates", "securityContext", "serviceAccount", "serviceAccountName",
    "setHostnameAsFQDN", "shareProcessNamespace", "sklearn", "storageContainerName",
    "storageUris", "subdomain", "tensorflow", "terminationGracePeriodSeconds", "timeout",
    "tolerations", "topologySpreadConstraints", "triton", "volumes", "workerSpec", "xgboost",
}  # fmt: skip
MODEL = {
    "args", "command", "confidential", "env", "envFrom", "image", "imagePullPolicy", "lifecycle",
    "livenessProbe", "modelFormat", "name", "ports", "protocolVersion", "readinessProbe",
    "resizePolicy", "resources", "restartPolicy", "restartPolicyRules", "runtime",
    "runtimeVersion", "securityContext", "startupProbe", "stdin", "stdinOnce", "storage",
    "storageUri", "terminationMessagePath", "terminationMessagePolicy", "tty", "volumeDevices",
    "volumeMounts", "workingDir",
}  # fmt: skip
MODEL_FORMAT = {"name", "version"}
K8S_VERSION = "1.32"


def _fields(where: str, obj: dict, allowed: set[str], required: set[str] = frozenset()) -> list:
    problems = [f"{where}.{key}: not a field KServe defines" for key in set(obj) - allowed]
    problems += [f"{where}.{key}: required" for key in required - set(obj)]
    return problems


def _metadata(where: str, obj: dict) -> list[str]:
    # Validate the metadata the way the API server would, through a core kind.
    probe = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj.get("metadata", {})}
    try:
        kubernetes_validate.validate(probe, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        return [f"{where}.metadata: {error.message}"]
    return [] if obj["metadata"].get("name") else [f"{where}.metadata.name: required"]


def _pod_spec(where: str, spec: dict) -> list[str]:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"}, "spec": spec}
    try:
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        return [f"{where}: {error.message} at {list(error.path)}"]
    return []


def kserve_problems(obj: dict) -> list[str]:
    """Everything in a ServingRuntime or InferenceService that KServe would not
    take; a core kind rendered beside them (the replicas' NetworkPolicy) is
    checked against Kubernetes' own schema."""
    kind = obj.get("kind")
    if kind == "NetworkPolicy":
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            return [f"NetworkPolicy: {error.message} at {list(error.path)}"]
        return []
    problems = _fields(kind, obj, {"apiVersion", "kind", "metadata", "spec"}, {"spec"})
    problems += _metadata(kind, obj)
    spec = obj.get("spec", {})
    if kind == "ServingRuntime":
        if obj.get("apiVersion") != "serving.kserve.io/v1alpha1":
            problems.append("ServingRuntime: apiVersion must be serving.kserve.io/v1alpha1")
        problems += _fields("spec", spec, SERVING_RUNTIME_SPEC, SERVING_RUNTIME_REQUIRED)
        for i, fmt in enumerate(spec.get("supportedModelFormats", [])):
            problems += _fields(
                f"supportedModelFormats[{i}]", fmt, SUPPORTED_MODEL_FORMAT, {"name"}
            )
        pod = {k: spec[k] for k in ("containers", "volumes", "tolerations") if k in spec}
        problems += _pod_spec("spec", pod)
        if not isinstance(spec.get("annotations", {}), dict):
            problems.append("spec.annotations: must be a map")
    elif kind == "InferenceService":
        if obj.get("apiVersion") != "serving.kserve.io/v1beta1":
            problems.append("InferenceService: apiVersion must be serving.kserve.io/v1beta1")
        problems += _fields("spec", spec, INFERENCE_SERVICE_SPEC, {"predictor"})
        predictor = spec.get("predictor", {})
        problems += _fields("predictor", predictor, PREDICTOR)
        model = predictor.get("model", {})
        problems += _fields("predictor.model", model, MODEL, {"modelFormat"})
        if "modelFormat" in model:
            problems += _fields("modelFormat", model["modelFormat"], MODEL_FORMAT, {"name"})
        if not isinstance(predictor.get("minReplicas", 0), int):
            problems.append("predictor.minReplicas: must be an integer")
    else:
        problems.append(f"{kind}: not a KServe kind this check knows")
    return problems
