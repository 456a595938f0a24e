"""deploy/kustomize: each overlay builds with `kubectl kustomize` and every
object validates against the Kubernetes schemas (kubernetes-validate); the
one OpenShift kind, Route, is checked against the fields route.openshift.io/v1
defines. Then what the issue asks of the manifests, object by object."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2] / "deploy" / "kustomize"
TARGETS = ["base", "overlays/dev", "overlays/openshift"]
K8S_VERSION = "1.32"
QUEUES = {"rollouts", "reconcile", "housekeeping"}
REQUIRED_SECRETS = {
    "DJANGO_SECRET_KEY",
    "DATABASE_URL",
    "CELERY_BROKER_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
}
# route.openshift.io/v1 RouteSpec and its parts (openshift/api route/v1/types.go).
ROUTE_SPEC = {
    "host", "subdomain", "path", "to", "alternateBackends", "port", "tls", "wildcardPolicy",
    "httpHeaders",
}  # fmt: skip
ROUTE_TARGET = {"kind", "name", "weight"}
ROUTE_TLS = {
    "termination", "certificate", "key", "caCertificate", "destinationCACertificate",
    "insecureEdgeTerminationPolicy", "externalCertificate",
}  # fmt: skip


def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        if os.environ.get("REQUIRE_DEPLOY_TOOLS") == "1":
            pytest.fail("kubectl is required (scripts/test.sh installs kubernetes-client)")
        pytest.skip("kubectl not installed (scripts/test.sh installs kubernetes-client)")
    return found


def build(target: str) -> list[dict]:
    result = subprocess.run(
        [kubectl(), "kustomize", str(ROOT / target)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module", params=TARGETS)
def built(request) -> tuple[str, list[dict]]:
    return request.param, build(request.param)


def route_problems(route: dict) -> list[str]:
    spec = route.get("spec", {})
    problems = [f"spec.{k}: not a Route field" for k in set(spec) - ROUTE_SPEC]
    target = spec.get("to", {})
    problems += [f"spec.to.{k}: not a field" for k in set(target) - ROUTE_TARGET]
    if target.get("kind") != "Service" or not target.get("name"):
        problems.append("spec.to: needs kind Service and a name")
    tls = spec.get("tls", {})
    problems += [f"spec.tls.{k}: not a field" for k in set(tls) - ROUTE_TLS]
    if tls and tls.get("termination") not in {"edge", "passthrough", "reencrypt"}:
        problems.append("spec.tls.termination: edge, passthrough or reencrypt")
    return problems


def named(objects, kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def workloads(objects) -> list[dict]:
    return [o for o in objects if o["kind"] in ("Deployment", "Job")]


def test_every_object_validates_against_the_kubernetes_schemas(built):
    target, objects = built
    assert objects, f"{target} built nothing"
    for obj in objects:
        if obj["kind"] == "Route":
            assert obj["apiVersion"] == "route.openshift.io/v1"
            assert route_problems(obj) == []
            continue
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_the_schema_check_can_fail():
    bad = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}, "spec": {}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)
    assert route_problems({"spec": {"to": {"kind": "Service", "name": "w"}, "hosts": []}})


def test_the_migration_job_alone_connects_as_the_tables_owner(built):
    _, objects = built
    job = named(objects, "Job")["lora-registry-migrate"]
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert 'db_grant_app_role "$DATABASE_APP_ROLE"' in container["command"][-1]
    (database,) = [e for e in container["env"] if e["name"] == "DATABASE_URL"]
    assert database["valueFrom"]["secretKeyRef"]["key"] == "MIGRATE_DATABASE_URL"
    for deployment in named(objects, "Deployment").values():
        for other in deployment["spec"]["template"]["spec"]["containers"]:
            assert "MIGRATE_DATABASE_URL" not in str(other.get("env", [])), deployment


def test_web_workers_per_queue_single_beat_and_watch(built):
    _, objects = built
    deployments = named(objects, "Deployment")
    web = deployments["lora-registry-web"]["spec"]["template"]["spec"]["containers"][0]
    assert web["command"][0] == "gunicorn"
    assert web["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert web["livenessProbe"]["httpGet"]["path"] == "/livez"
    queues = {}
    for deployment in deployments.values():
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        if container["command"][:4] == ["celery", "-A", "config", "worker"]:
            queue = next(a.split("=", 1)[1] for a in container["args"] if a.startswith("--queues="))
            queues[queue] = deployment
    assert set(queues) == QUEUES
    for deployment in queues.values():
        pod = deployment["spec"]["template"]["spec"]
        claims = {v["name"]: v.get("persistentVolumeClaim", {}) for v in pod["volumes"]}
        mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        assert claims["adapters"]["claimName"] == "pvc-lora-adapters-shared"
        assert mounts["adapters"] == "/mnt/adapters"
    for single in ("lora-registry-beat", "lora-registry-watch-replicas"):
        assert deployments[single]["spec"]["replicas"] == 1
        assert deployments[single]["spec"]["strategy"]["type"] == "Recreate"
    watch = deployments["lora-registry-watch-replicas"]["spec"]["template"]["spec"]
    assert watch["containers"][0]["command"] == ["python", "manage.py", "watch_replicas"]
    assert watch["serviceAccountName"] == "lora-registry-watcher"
    service = named(objects, "Service")["lora-registry-web"]
    assert service["spec"]["selector"].items() <= (
        deployments["lora-registry-web"]["spec"]["template"]["metadata"]["labels"].items()
    )


def test_the_adapter_volume_is_read_write_many(built):
    _, objects = built
    claim = named(objects, "PersistentVolumeClaim")["pvc-lora-adapters-shared"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]


def test_the_watch_may_get_list_and_watch_endpointslices_and_nothing_else(built):
    _, objects = built
    role = named(objects, "Role")["lora-registry-endpointslice-reader"]
    assert role["rules"] == [
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    binding = named(objects, "RoleBinding")["lora-registry-endpointslice-reader"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert [s["name"] for s in binding["subjects"]] == ["lora-registry-watcher"]
    assert "lora-registry-watcher" in named(objects, "ServiceAccount")


def test_every_container_is_non_root_read_only_with_requests_and_reads_the_secret(built):
    _, objects = built
    for workload in workloads(objects):
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, workload["metadata"]["name"]
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"]["drop"] == ["ALL"]
            assert {"cpu", "memory"} <= set(container["resources"]["requests"])
            refs = [e["secretRef"]["name"] for e in container["envFrom"] if "secretRef" in e]
            assert refs == ["lora-registry"]


def test_the_base_references_secrets_and_contains_none():
    objects = build("base")
    assert named(objects, "Secret") == {}
    for config in named(objects, "ConfigMap").values():
        assert not set(config["data"]) & REQUIRED_SECRETS


def test_the_dev_overlay_generates_every_required_secret_key():
    secret = named(build("overlays/dev"), "Secret")["lora-registry"]
    keys = set(secret.get("data", {})) | set(secret.get("stringData", {}))
    assert keys >= REQUIRED_SECRETS


def test_openshift_has_a_route_and_no_fixed_uids():
    objects = build("overlays/openshift")
    route = named(objects, "Route")["lora-registry-web"]
    assert route["spec"]["to"]["name"] == "lora-registry-web"
    assert route["spec"]["tls"]["termination"] == "edge"
    for workload in workloads(objects):
        pod = workload["spec"]["template"]["spec"]
        fixed = {"runAsUser", "runAsGroup", "fsGroup"} & set(pod["securityContext"])
        assert not fixed, workload["metadata"]["name"]
        for container in pod["containers"]:
            assert "runAsUser" not in container["securityContext"]
    base_web = named(build("base"), "Deployment")["lora-registry-web"]
    assert base_web["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 10001
    host = route["spec"]["host"]
    config = named(objects, "ConfigMap")["lora-registry-config"]
    assert host in config["data"]["DJANGO_ALLOWED_HOSTS"].split(",")


def test_each_worker_is_restarted_when_it_stops_consuming_its_liveness_ping(built):
    _, objects = built
    workers = [
        d["spec"]["template"]["spec"]["containers"][0]
        for d in named(objects, "Deployment").values()
        if d["spec"]["template"]["spec"]["containers"][0]["command"][:4]
        == ["celery", "-A", "config", "worker"]
    ]
    assert len(workers) == len(QUEUES)
    for container in workers:
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        path = env["WORKER_LIVENESS_FILE"]
        assert path.startswith("/tmp/")  # the emptyDir: the root filesystem is read-only
        command = container["livenessProbe"]["exec"]["command"]
        assert command[:4] == ["python", "-m", "config.celery_alive", path]


def test_the_front_door_is_a_service_and_only_workers_reach_its_runtime_api(built):
    _, objects = built
    deployments = named(objects, "Deployment")
    gateway = deployments["lora-registry-gateway"]
    assert gateway["spec"]["replicas"] == 1
    pod = gateway["spec"]["template"]["spec"]
    assert "--print-command" in pod["containers"][0]["args"][0]
    services = named(objects, "Service")
    assert [p["port"] for p in services["lora-registry-gateway"]["spec"]["ports"]] == [8080]
    assert [p["port"] for p in services["lora-registry-gateway-admin"]["spec"]["ports"]] == [
        9999,
        10000,
    ]
    policy = named(objects, "NetworkPolicy")["lora-registry-gateway"]["spec"]
    admin = next(rule for rule in policy["ingress"] if "from" in rule)
    (source,) = admin["from"]
    assert source["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "worker"
    assert {p["port"] for p in admin["ports"]} == {9999, 10000}
    # The workers that drive it mount the gateway volume it reads.
    for name in ("rollouts", "reconcile"):
        worker = deployments[f"lora-registry-worker-{name}"]["spec"]["template"]["spec"]
        mounts = {m["name"]: m["mountPath"] for m in worker["containers"][0]["volumeMounts"]}
        assert mounts["gateway"] == "/var/run/gateway"
    config = named(objects, "ConfigMap")["lora-registry-config"]["data"]
    assert config["SERVING_GATEWAY_ADMIN"].endswith("=lora-registry-gateway-admin:9999")
