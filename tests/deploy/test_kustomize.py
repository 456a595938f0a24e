"""deploy/kustomize: each overlay builds with `kubectl kustomize` and every
object validates against the Kubernetes schemas (kubernetes-validate); the
one OpenShift kind, Route, is checked against the fields route.openshift.io/v1
defines. Then what the issue asks of the manifests, object by object."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from config import roles
from tests.deploy.startup import settings_started

ROOT = Path(__file__).resolve().parents[2] / "deploy" / "kustomize"
TARGETS = ["base", "overlays/dev", "overlays/openshift"]
K8S_VERSION = "1.32"
QUEUES = {"rollouts", "reconcile", "housekeeping"}
REQUIRED_SECRETS = {
    "DJANGO_SECRET_KEY",
    "FIELD_ENCRYPTION_KEY",
    "DATABASE_URL",
    "MIGRATE_DATABASE_URL",
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


def containers(objects) -> list[tuple[dict, dict]]:
    """(workload, container) of every container of every workload."""
    return [
        (workload, container)
        for workload in workloads(objects)
        for container in workload["spec"]["template"]["spec"]["containers"]
    ]


def celery_queue(container: dict) -> str | None:
    if container["command"][:4] != ["celery", "-A", "config", "worker"]:
        return None
    return next(a.split("=", 1)[1] for a in container["args"] if a.startswith("--queues="))


def test_the_migration_job_alone_connects_as_the_tables_owner(built):
    _, objects = built
    job = named(objects, "Job")["lora-registry-migrate"]
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert 'db_grant_app_role "$DATABASE_APP_ROLE"' in container["command"][-1]
    (database,) = [e for e in container["env"] if e["name"] == "DATABASE_URL"]
    assert database["valueFrom"]["secretKeyRef"]["key"] == "MIGRATE_DATABASE_URL"
    for workload, container in containers(objects):
        keys = set(secret_keys(workload, container))
        if workload["kind"] == "Job":
            assert keys == {"MIGRATE_DATABASE_URL"}
        else:
            assert "MIGRATE_DATABASE_URL" not in keys, workload["metadata"]["name"]


def test_web_workers_per_queue_single_beat_and_watch(built):
    _, objects = built
    deployments = named(objects, "Deployment")
    web = deployments["lora-registry-web"]["spec"]["template"]["spec"]["containers"][0]
    assert web["command"][0] == "gunicorn"
    assert web["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert web["livenessProbe"]["httpGet"]["path"] == "/livez"
    queues = {}
    for workload, container in containers(objects):
        queue = celery_queue(container)
        if queue:
            assert queue not in queues
            queues[queue] = (workload, container)
    assert set(queues) == QUEUES
    for workload, container in queues.values():
        pod = workload["spec"]["template"]["spec"]
        claims = {v["name"]: v.get("persistentVolumeClaim", {}) for v in pod["volumes"]}
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
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


def test_every_container_is_non_root_read_only_with_requests(built):
    _, objects = built
    for workload, container in containers(objects):
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, workload["metadata"]["name"]
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"]["drop"] == ["ALL"]
        assert {"cpu", "memory"} <= set(container["resources"]["requests"])


def secret_keys(workload: dict, container: dict) -> dict[str, dict]:
    """Every key of a Secret a container can read: {key: its secretKeyRef and
    env name}; a whole Secret (envFrom, or a volume of the pod it mounts) shows
    as "*<name>"."""
    keys: dict[str, dict] = {}
    for source in container.get("envFrom", []):
        if "secretRef" in source:
            keys["*" + source["secretRef"]["name"]] = source["secretRef"]
    for entry in container.get("env", []):
        ref = entry.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            keys[ref["key"]] = {**ref, "env": entry["name"]}
    mounted = {m["name"] for m in container.get("volumeMounts", [])}
    for volume in workload["spec"]["template"]["spec"].get("volumes", []):
        if volume["name"] not in mounted:
            continue
        for source in [volume, *volume.get("projected", {}).get("sources", [])]:
            if "secret" in source:
                secret = source["secret"]
                keys["*" + secret.get("secretName", secret.get("name", ""))] = {}
    return keys


def role_of(container: dict) -> str:
    found = [e["value"] for e in container.get("env", []) if e["name"] == "PROCESS_ROLE"]
    assert found, f"{container['name']} says no PROCESS_ROLE"
    return found[0]


# (workload, container): the process it runs (config/roles.py).
EXPECTED_ROLES = {
    ("lora-registry-web", "web"): "web",
    ("lora-registry-gateway", "haproxy"): "gateway",
    ("lora-registry-gateway", "worker-rollouts"): "worker-rollouts",
    ("lora-registry-gateway", "worker-reconcile"): "worker-reconcile",
    ("lora-registry-worker-housekeeping", "worker"): "worker-housekeeping",
    ("lora-registry-beat", "beat"): "beat",
    ("lora-registry-watch-replicas", "watch-replicas"): "discovery",
    ("lora-registry-migrate", "migrate"): "migrate",
}


def test_each_container_reads_only_the_secret_keys_its_process_reads(built):
    """No container gets the whole Secret: each names its process (PROCESS_ROLE)
    and takes exactly the keys config/roles.py says that process reads, the
    ones it cannot run without as required references, the others optional."""
    _, objects = built
    found = {(w["metadata"]["name"], c["name"]): c for w, c in containers(objects)}
    assert set(found) == set(EXPECTED_ROLES)
    for workload, container in containers(objects):
        where = (workload["metadata"]["name"], container["name"])
        role = role_of(container)
        assert role == EXPECTED_ROLES[where]
        keys = secret_keys(workload, container)
        assert not [k for k in keys if k.startswith("*")], f"{where} reads a whole Secret"
        as_env = {ref["env"]: ref for ref in keys.values()}
        assert set(as_env) == roles.reads(role), where
        for env, ref in as_env.items():
            assert ref["name"] == "lora-registry"
            assert ref.get("optional", False) is (env in roles.OPTIONAL[role]), (where, env)
            owner = role == "migrate" and env == "DATABASE_URL"
            assert ref["key"] == ("MIGRATE_DATABASE_URL" if owner else env), (where, env)


def test_the_front_door_reads_no_secret_and_starts_without_the_database(built):
    _, objects = built
    gateway = named(objects, "Deployment")["lora-registry-gateway"]
    haproxy = front_door_container(gateway)
    assert secret_keys(gateway, haproxy) == {}
    assert "--offline" in haproxy["args"][0]
    assert "--print-command" in haproxy["args"][0]


def front_door_container(gateway: dict) -> dict:
    (haproxy,) = [
        c for c in gateway["spec"]["template"]["spec"]["containers"] if c["name"] == "haproxy"
    ]
    return haproxy


def matches(selector: dict, labels: dict) -> bool:
    """A Kubernetes label selector (matchLabels, matchExpressions) against labels."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator = expression["key"], expression["operator"]
        if operator == "In":
            found = labels.get(key) in expression["values"]
        elif operator == "NotIn":
            found = labels.get(key) not in expression["values"]
        else:
            found = (key in labels) is (operator == "Exists")
        if not found:
            return False
    return True


def admitted(policy: dict, port: int, objects) -> set[str]:
    """The workloads whose pods a NetworkPolicy's ingress rules admit to `port`
    (pod selectors in the policy's namespace; "*": anyone)."""
    pods = {
        w["metadata"]["name"]: w["spec"]["template"]["metadata"]["labels"]
        for w in workloads(objects)
    }
    names = set()
    for rule in policy["spec"].get("ingress", []):
        ports = [p["port"] for p in rule.get("ports", [])]
        if ports and port not in ports:
            continue
        sources = rule.get("from")
        if sources is None:  # no `from`: everyone
            return {"*"}
        for source in sources:
            if set(source) == {"namespaceSelector"}:  # another namespace: named so
                labels = source["namespaceSelector"]["matchLabels"]
                names.add("namespace " + labels["kubernetes.io/metadata.name"])
                continue
            assert set(source) == {"podSelector"}, source
            names |= {n for n, labels in pods.items() if matches(source["podSelector"], labels)}
    return names


def test_the_selector_check_can_fail():
    labels = {"app.kubernetes.io/name": "lora-registry-worker-housekeeping"}
    assert matches(
        {"matchLabels": {"app.kubernetes.io/name": labels["app.kubernetes.io/name"]}}, labels
    )
    assert not matches(
        {
            "matchExpressions": [
                {"key": "app.kubernetes.io/name", "operator": "In", "values": ["x"]}
            ]
        },
        labels,
    )


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
    workers = [c for _, c in containers(objects) if celery_queue(c)]
    assert len(workers) == len(QUEUES)
    for container in workers:
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        path = env["WORKER_LIVENESS_FILE"]
        assert path.startswith("/tmp/")  # the emptyDir: the root filesystem is read-only
        command = container["livenessProbe"]["exec"]["command"]
        assert command[:4] == ["python", "-m", "config.celery_alive", path]


def test_only_what_drives_the_front_door_reaches_its_runtime_api(built):
    """HAProxy's runtime API and master CLI have no authentication of their own,
    so they are UNIX sockets in an emptyDir of the gateway's pod, shared only
    with what drives it (serving/door/services.py): the rollouts worker
    (swaps, canaries) and the reconcile worker (routes, usage); not
    housekeeping, web, beat or discovery. No admin port is on the network."""
    _, objects = built
    deployments = named(objects, "Deployment")
    gateway = deployments["lora-registry-gateway"]
    assert gateway["spec"]["replicas"] == 1
    assert gateway["spec"]["strategy"]["type"] == "Recreate"
    pod = gateway["spec"]["template"]["spec"]
    haproxy = front_door_container(gateway)
    assert [p["containerPort"] for p in haproxy["ports"]] == [8080, 8404]
    services = named(objects, "Service")
    assert [p["port"] for p in services["lora-registry-gateway"]["spec"]["ports"]] == [8080]
    # The exporter (read-only, but it names the adapters): Prometheus's pods alone.
    metrics = services["lora-registry-gateway-metrics"]["spec"]["ports"]
    assert [p["port"] for p in metrics] == [8404]
    assert "lora-registry-gateway-admin" not in services
    config = named(objects, "ConfigMap")["lora-registry-config"]["data"]
    assert "SERVING_GATEWAY_ADMIN" not in config  # the TCP form of the runtime API
    (volume,) = [v for v in pod["volumes"] if v["name"] == "gateway"]
    assert volume == {"name": "gateway", "emptyDir": {}}
    sharing = {
        c["name"]: celery_queue(c)
        for c in pod["containers"]
        if {"name": "gateway", "mountPath": config["SERVING_DOOR_DIR"]} in c.get("volumeMounts", [])
    }
    assert sharing == {
        "haproxy": None,
        "worker-rollouts": "rollouts",
        "worker-reconcile": "reconcile",
    }
    for workload, container in containers(objects):
        if workload is not gateway:
            mounts = [m["mountPath"] for m in container.get("volumeMounts", [])]
            assert config["SERVING_DOOR_DIR"] not in mounts, workload["metadata"]["name"]
    policy = named(objects, "NetworkPolicy")["lora-registry-gateway"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert admitted(policy, 8080, objects) == {"*"}
    assert admitted(policy, 8404, objects) == {"namespace monitoring"}
    for port in (9999, 10000):  # where the runtime API and master CLI were
        assert admitted(policy, port, objects) == set()


# Stand-ins for the Secret's values: settings parse them, nothing connects.
SECRET_VALUES = {
    "DATABASE_URL": "postgres://registry_app:pw@postgres:5432/registry",
    "MIGRATE_DATABASE_URL": "postgres://registry:pw@postgres:5432/registry",
    "CELERY_BROKER_URL": "redis://redis:6379/0",
}
# Single sign-on on in the ConfigMap: processes without the client secret must start too.
SSO_CONFIG = {"OIDC_ISSUER": "https://idp.example.com/realm", "OIDC_RP_CLIENT_ID": "registry"}


def pod_environment(
    workload: dict, container: dict, config: dict, tmp_path: Path, *, without=()
) -> dict:
    """Exactly the environment the container gets: the ConfigMap, its own
    values, its Secret's keys (stand-ins), less the keys in `without`."""
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    env.update(config, **SSO_CONFIG)
    for entry in container.get("env", []):
        ref = entry.get("valueFrom", {}).get("secretKeyRef")
        if ref and ref["key"] not in without:
            env[entry["name"]] = SECRET_VALUES.get(ref["key"], f"stand-in-{ref['key']}")
        elif "value" in entry:
            env[entry["name"]] = entry["value"]
    # The container's emptyDir.
    env["VAR_DIR"] = str(tmp_path / workload["metadata"]["name"] / container["name"])
    return env


def test_each_container_starts_with_its_keys_and_stops_naming_a_missing_one(tmp_path):
    """Settings fail fast on what a process needs, so a container given fewer
    keys than it reads would not start: each one's own keys (with SSO on) are
    enough, and without the keys it needs it stops, naming them."""
    objects = build("base")
    config = named(objects, "ConfigMap")["lora-registry-config"]["data"]
    cases, expected = [], []
    for workload, container in containers(objects):
        role = role_of(container)
        cases.append(pod_environment(workload, container, config, tmp_path))
        expected.append([role])
        needed = {
            ref["key"]
            for ref in secret_keys(workload, container).values()
            if not ref.get("optional")
        }
        if needed:
            cases.append(pod_environment(workload, container, config, tmp_path, without=needed))
            expected.append([f"PROCESS_ROLE={role} needs", *sorted(roles.REQUIRED[role])])
    for got, words in zip(settings_started(cases), expected, strict=True):
        assert all(word in got for word in words), (got, words)
        assert got.startswith("error") is (len(words) > 1), got


def test_the_front_doors_container_starts_haproxy_with_no_secret_and_no_database(tmp_path):
    """The HAProxy container's own command, in its own environment (no key of
    the Secret, no DATABASE_URL: settings' SQLite default has no tables), starts
    a real HAProxy whose runtime API answers on the pod's shared folder."""
    if shutil.which("haproxy") is None:
        if os.environ.get("REQUIRE_DEPLOY_TOOLS") == "1":
            pytest.fail("haproxy is required (scripts/test.sh installs it)")
        pytest.skip("haproxy not installed")
    from serving.door.haproxy import RuntimeAPI
    from tests.support.vllm_servers import free_port

    objects = build("base")
    config = named(objects, "ConfigMap")["lora-registry-config"]["data"]
    gateway = named(objects, "Deployment")["lora-registry-gateway"]
    haproxy = front_door_container(gateway)
    env = pod_environment(gateway, haproxy, config, tmp_path)
    assert not {"DATABASE_URL", "DJANGO_SECRET_KEY", "FIELD_ENCRYPTION_KEY"} & set(env)
    # A free port instead of 8080, and a folder of this test as the emptyDir.
    shared = tmp_path / "gateway"
    env.update(
        PATH=f"{Path(sys.executable).parent}:{env['PATH']}",
        SERVING_DOORS=f"{config['DOOR_DEPLOYMENT']}=127.0.0.1:{free_port()}",
        SERVING_DOOR_DIR=str(shared),
    )
    log_path = tmp_path / "gateway.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [*haproxy["command"], *haproxy["args"]],
            cwd=ROOT.parents[1],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        runtime = RuntimeAPI(shared / config["DOOR_DEPLOYMENT"] / "admin.sock")
        deadline = time.monotonic() + 60
        while not runtime.available():
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)
        assert "Name: HAProxy" in runtime.command("show info")
        # The base model's route alone until the workers write theirs.
        assert "base" in runtime.command("show backend")
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(20)
