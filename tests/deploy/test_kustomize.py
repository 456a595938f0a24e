"""deploy/kustomize: each overlay builds with `kubectl kustomize` and every
object validates against the Kubernetes schemas (kubernetes-validate); the
one OpenShift kind, Route, is checked against the fields route.openshift.io/v1
defines. Then what the issue asks of the manifests, object by object."""

from __future__ import annotations

import base64
import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass
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
                name = secret.get("secretName", secret.get("name", ""))
                if name in (DOOR_TLS_SECRET, DOOR_CREDENTIALS_SECRET):
                    continue
                keys["*" + name] = {}
    return keys


# The door's own certificate and key (docs/door.md#tls) and its token
# (docs/door.md#doors-that-pull): no secret of the application, and the doors
# alone mount them (test_only_the_doors_mount_the_doors_secrets).
DOOR_TLS_SECRET = "lora-registry-door-tls"
DOOR_CREDENTIALS_SECRET = "lora-registry-door-credentials"


def role_of(container: dict) -> str:
    found = [e["value"] for e in container.get("env", []) if e["name"] == "PROCESS_ROLE"]
    assert found, f"{container['name']} says no PROCESS_ROLE"
    return found[0]


# (workload, container): the process it runs (config/roles.py).
EXPECTED_ROLES = {
    ("lora-registry-web", "web"): "web",
    ("lora-registry-gateway", "door"): "gateway",
    ("lora-registry-worker-rollouts", "worker"): "worker-rollouts",
    ("lora-registry-worker-reconcile", "worker"): "worker-reconcile",
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


DOOR = "lora-registry-gateway"
# The agent's variables (serving/door/agent.py) the door's pod need not set:
# DOOR_PEERS lists fixed peers, which a Deployment's pods have no names for;
# they find each other through the control plane (DOOR_PEER_ADDRESS) instead.
AGENT_OPTIONAL = {"DOOR_PEERS"}
PEERS_PORT = 10010
APPLICATION_SECRETS = {"DATABASE_URL", "DJANGO_SECRET_KEY", "FIELD_ENCRYPTION_KEY"}


def door_container(objects) -> tuple[dict, dict]:
    """(the door's Deployment, its one container)."""
    door = named(objects, "Deployment")[DOOR]
    (container,) = door["spec"]["template"]["spec"]["containers"]
    return door, container


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def agent_variables() -> set[str]:
    """Every DOOR_* variable the agent reads, from its source."""
    source = (ROOT.parents[1] / "serving" / "door" / "agent.py").read_text()
    return set(re.findall(r"""["'](DOOR_[A-Z_]+)["']""", source))


def test_the_door_is_a_deployment_of_two_doors_and_no_worker(built):
    """Doors that pull (docs/door.md#doors-that-pull): HAProxy and its agent,
    two pods at least, and no worker beside them."""
    _, objects = built
    door, container = door_container(objects)
    assert door["spec"]["replicas"] >= 2
    assert door["spec"]["strategy"]["type"] == "RollingUpdate"
    assert container["command"] == ["python", "-m", "serving.door.agent"]
    assert celery_queue(container) is None
    assert role_of(container) == "gateway"


def test_a_disruption_budget_keeps_a_door_and_doors_spread_over_nodes(built):
    _, objects = built
    door, _ = door_container(objects)
    labels = door["spec"]["template"]["metadata"]["labels"]
    budgets = [
        b
        for b in named(objects, "PodDisruptionBudget").values()
        if matches(b["spec"]["selector"], labels)
    ]
    assert len(budgets) == 1
    assert 1 <= budgets[0]["spec"]["minAvailable"] < door["spec"]["replicas"]
    anti = door["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    terms = [
        *anti.get("requiredDuringSchedulingIgnoredDuringExecution", []),
        *[
            t["podAffinityTerm"]
            for t in anti.get("preferredDuringSchedulingIgnoredDuringExecution", [])
        ],
    ]
    assert [t["topologyKey"] for t in terms] == ["kubernetes.io/hostname"]
    assert matches(terms[0]["labelSelector"], labels)


def test_a_door_is_ready_only_while_its_lease_holds(built):
    """HAProxy answers /door/ready with 200 while the door's lease holds, 503
    past it; nothing listens before its first state. Over TLS: the door has
    a certificate."""
    _, objects = built
    _, container = door_container(objects)
    probe = container["readinessProbe"]["httpGet"]
    assert probe["path"] == "/door/ready"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    listen = env_of(container)["DOOR_LISTEN"]["value"]
    assert ports[probe["port"]] == int(listen.rsplit(":", 1)[1])
    assert probe["scheme"] == (
        "HTTPS" if env_of(container)["DOOR_CERTIFICATE"]["value"] else "HTTP"
    )
    assert "livenessProbe" not in container  # the agent restarts HAProxy itself


def test_the_agent_gets_every_variable_it_needs_and_nothing_of_the_application(built):
    _, objects = built
    door, container = door_container(objects)
    env = env_of(container)
    # The ones it stops without are among those read (the reading is not empty).
    assert {"DOOR_DEPLOYMENT", "DOOR_CONTROL_PLANE", "DOOR_TOKEN_FILE"} < agent_variables()
    assert agent_variables() - AGENT_OPTIONAL <= set(env)
    assert not AGENT_OPTIONAL & set(env)
    # No ConfigMap, no Secret of the application: the agent runs no Django.
    assert "envFrom" not in container
    assert not APPLICATION_SECRETS & set(env)
    assert secret_keys(door, container) == {}
    value = {name: e.get("value") for name, e in env.items()}
    assert env["DOOR_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    # The deployment it fronts pulls its state.
    config = _config(objects)
    doors = dict(item.split("=", 1) for item in config["SERVING_DOORS"].split(","))
    assert doors[value["DOOR_DEPLOYMENT"]] == "pull"
    # The control plane is the web Service, on its port.
    web = named(objects, "Service")["lora-registry-web"]
    assert (
        value["DOOR_CONTROL_PLANE"] == f"http://lora-registry-web:{web['spec']['ports'][0]['port']}"
    )
    # Its files in the pod's own emptyDir (the root filesystem is read-only).
    pod = door["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert volumes[mounts[value["DOOR_DIR"]]] == {"name": mounts[value["DOOR_DIR"]], "emptyDir": {}}
    # Its token: this deployment's key of the doors' Secret, alone, as a file.
    token = Path(value["DOOR_TOKEN_FILE"])
    credential = volumes[mounts[str(token.parent)]]["secret"]
    assert credential["secretName"] == DOOR_CREDENTIALS_SECRET
    assert credential["items"] == [{"key": value["DOOR_DEPLOYMENT"], "path": token.name}]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert value["DOOR_METRICS"].endswith(f":{ports['metrics']}")
    # Its peers address: the pod's own IP (expanded by the kubelet), on the peers port.
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert value["DOOR_PEER_ADDRESS"] == f"$(POD_IP):{ports['peers']}" == f"$(POD_IP):{PEERS_PORT}"


def test_only_the_doors_mount_the_doors_secrets(built):
    _, objects = built
    for workload, container in containers(objects):
        secrets = {
            v["secret"]["secretName"]
            for v in workload["spec"]["template"]["spec"].get("volumes", [])
            if "secret" in v and v["name"] in {m["name"] for m in container.get("volumeMounts", [])}
        }
        if workload["metadata"]["name"] == DOOR:
            assert secrets == {DOOR_TLS_SECRET, DOOR_CREDENTIALS_SECRET}
        else:
            assert not secrets & {DOOR_TLS_SECRET, DOOR_CREDENTIALS_SECRET}, workload["metadata"]


def test_the_dev_overlay_s_door_token_is_the_one_its_secret_key_gives():
    from serving.api.doors import door_token

    secrets = named(build("overlays/dev"), "Secret")
    key = base64.b64decode(secrets["lora-registry"]["data"]["DJANGO_SECRET_KEY"]).decode()
    tokens = secrets[DOOR_CREDENTIALS_SECRET]["data"]
    assert {k: base64.b64decode(v).decode() for k, v in tokens.items()} == {
        "production": door_token("production", key)
    }


@dataclass(frozen=True)
class MountedSecret:
    root: Path
    authority: object


def tls_secret_mount(gateway: dict, root: Path) -> MountedSecret:
    """The door's TLS Secret as the pod mounts it, from a CA made here: each
    item of the Secret volume written at its path, under `root`."""
    from tests.support.tls import make_authority

    authority = make_authority(root / "ca")
    pod = gateway["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "door-tls"]
    keys = {"tls.crt": authority.crt, "tls.key": authority.crt.with_name("tls.crt.key")}
    for item in volume["secret"]["items"]:
        (root / item["path"]).write_bytes(keys[item["key"]].read_bytes())
    return MountedSecret(root, authority)


def test_the_front_door_takes_its_certificate_from_a_tls_secret(built):
    _, objects = built
    gateway, container = door_container(objects)
    pod = gateway["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "door-tls"]
    assert volume["secret"]["secretName"] == DOOR_TLS_SECRET
    # cert-manager's keys of a kubernetes.io/tls Secret; the key beside the
    # certificate, where HAProxy looks for it.
    assert volume["secret"]["items"] == [
        {"key": "tls.crt", "path": "door.pem"},
        {"key": "tls.key", "path": "door.pem.key"},
    ]
    assert volume["secret"]["defaultMode"] == 0o440
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "door-tls"]
    assert mount["readOnly"] is True
    assert env_of(container)["DOOR_CERTIFICATE"]["value"] == f"{mount['mountPath']}/door.pem"


def test_openshift_passes_the_door_s_tls_through_to_haproxy():
    objects = build("overlays/openshift")
    route = named(objects, "Route")[DOOR]
    assert route["spec"]["to"]["name"] == DOOR
    assert route["spec"]["port"]["targetPort"] == "openai"
    assert route["spec"]["tls"]["termination"] == "passthrough"
    urls = dict(i.split("=", 1) for i in _config(objects)["SERVING_DOOR_URLS"].split(","))
    assert urls["production"] == f"https://{route['spec']['host']}"


def test_every_deployment_s_doors_pull_their_state_and_the_pages_know_their_url(built):
    _, objects = built
    config = _config(objects)
    doors = dict(item.split("=", 1) for item in config["SERVING_DOORS"].split(","))
    assert doors and set(doors.values()) == {"pull"}
    urls = dict(item.split("=", 1) for item in config["SERVING_DOOR_URLS"].split(","))
    assert set(urls) == set(doors)
    assert all(url.startswith("https://") for url in urls.values())


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


def test_the_rollouts_and_reconcile_workers_run_in_deployments_of_their_own(built):
    """They left the door's pod: each scales on its own, and the doors pull
    what they write."""
    _, objects = built
    deployments = named(objects, "Deployment")
    for queue in ("rollouts", "reconcile"):
        worker = deployments[f"lora-registry-worker-{queue}"]
        (container,) = worker["spec"]["template"]["spec"]["containers"]
        assert celery_queue(container) == queue
        assert role_of(container) == f"worker-{queue}"


def test_no_worker_reaches_a_door_s_runtime_socket(built):
    """HAProxy's runtime API and master CLI have no authentication of their
    own: UNIX sockets in the door's own emptyDir, which no other container
    mounts (each door's agent drives its HAProxy), and no admin port."""
    _, objects = built
    door, container = door_container(objects)
    directory = env_of(container)["DOOR_DIR"]["value"]
    for workload, other in containers(objects):
        if workload is door:
            continue
        paths = [m["mountPath"] for m in other.get("volumeMounts", [])]
        assert directory not in paths, workload["metadata"]["name"]
    services = named(objects, "Service")
    assert [p["port"] for p in services[DOOR]["spec"]["ports"]] == [8080]
    assert [p["port"] for p in services[f"{DOOR}-metrics"]["spec"]["ports"]] == [8404]
    assert f"{DOOR}-admin" not in services
    assert "SERVING_GATEWAY_ADMIN" not in _config(objects)  # the TCP form of the runtime API
    assert "SERVING_DOOR_DIR" not in _config(objects)  # no worker drives a door's files


def reached(policy: dict, objects) -> set[tuple[str, int]]:
    """What a NetworkPolicy's egress rules let its pods reach: (workload of
    this kustomization, port), ("replicas", port) for KServe's pods in any
    namespace, ("any pod", port) for any pod anywhere."""
    pods = {
        w["metadata"]["name"]: w["spec"]["template"]["metadata"]["labels"]
        for w in workloads(objects)
    }
    found = set()
    for rule in policy["spec"].get("egress", []):
        ports = [p["port"] for p in rule["ports"]]  # a rule without ports: not allowed here
        for peer in rule["to"]:  # a rule without `to`: not allowed here
            if peer == {"namespaceSelector": {}}:
                names = {"any pod"}
            elif peer.get("namespaceSelector") == {}:
                expressions = peer["podSelector"]["matchExpressions"]
                assert expressions == [
                    {"key": "serving.kserve.io/inferenceservice", "operator": "Exists"}
                ], peer
                names = {"replicas"}
            else:
                assert set(peer) == {"podSelector"}, peer
                names = {n for n, labels in pods.items() if matches(peer["podSelector"], labels)}
            found |= {(name, port) for name in names for port in ports}
    return found


def test_a_door_reaches_the_door_state_endpoint_and_the_replicas_only(built):
    """Its state from web (no database, broker or store), its requests to the
    replicas, and DNS; clients on the OpenAI port, Prometheus on the exporter."""
    from serving.kserve import PORT

    _, objects = built
    policy = named(objects, "NetworkPolicy")[DOOR]
    door, _ = door_container(objects)
    assert matches(policy["spec"]["podSelector"], door["spec"]["template"]["metadata"]["labels"])
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    assert admitted(policy, 8080, objects) == {"*"}
    assert admitted(policy, 8404, objects) == {"namespace monitoring"}
    # The doors talk HAProxy's peers protocol with each other, nobody else.
    assert admitted(policy, PEERS_PORT, objects) == {DOOR}
    for port in (9999, 10000):  # where the runtime API and master CLI were
        assert admitted(policy, port, objects) == set()
    assert reached(policy, objects) == {
        ("lora-registry-web", 8000),
        (DOOR, PEERS_PORT),
        ("replicas", PORT),
        *{("any pod", port) for port in (53, 5353)},  # DNS (OpenShift's answers on 5353)
    }


def test_the_replicas_admit_the_doors_and_the_workers_that_call_them(built):
    """serving/kserve.py renders the replicas' NetworkPolicy: it admits the
    pods with its label, which are the doors and the workers that load
    adapters and read /metrics, not web, housekeeping, beat or discovery."""
    from serving.kserve import REPLICA_CLIENT_LABEL

    _, objects = built
    admitted_pods = {
        w["metadata"]["name"]
        for w in workloads(objects)
        if matches(
            {"matchLabels": REPLICA_CLIENT_LABEL}, w["spec"]["template"]["metadata"]["labels"]
        )
    }
    assert admitted_pods == {
        DOOR,
        "lora-registry-worker-rollouts",
        "lora-registry-worker-reconcile",
    }


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
    if any("configMapRef" in source for source in container.get("envFrom", [])):
        env.update(config)
    env.update(SSO_CONFIG)
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


class StandInControlPlane(http.server.ThreadingHTTPServer):
    """The door-state endpoint (serving/api/doors.py) as the agent sees it:
    one state for `token`, 304 after that, a 404 for anything else, and the
    acknowledgements it gets. `answering = False`: 404 for everything, as
    for a rotated token."""

    daemon_threads = True

    def __init__(self, token: str, document: dict):
        self.token, self.document = token, document
        self.answering = True
        self.acks: list[dict] = []
        super().__init__(("127.0.0.1", 0), _StandInHandler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _StandInHandler(http.server.BaseHTTPRequestHandler):
    server: StandInControlPlane

    def log_message(self, *args) -> None:
        pass

    def _answer(self, status: int, body: dict | None = None) -> None:
        data = json.dumps(body).encode() if body is not None else b""
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _allowed(self, what: str) -> bool:
        url = urllib.parse.urlsplit(self.path)
        return (
            self.server.answering
            and url.path == f"/doors/production/{what}"
            and self.headers.get("Authorization") == f"Bearer {self.server.token}"
        )

    def do_GET(self) -> None:
        if not self._allowed("state"):
            return self._answer(404, {"detail": "No door state."})
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        if query["known"] == ["0"]:
            return self._answer(200, {"generation": 1, "document": self.server.document})
        time.sleep(min(float(query["wait"][0]), 0.5))
        return self._answer(304)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        if not self._allowed("ack"):
            return self._answer(404, {"detail": "No door state."})
        self.server.acks.append(body)
        # The live doors that gave a peers address: this one, as the real
        # endpoint lists it back (serving/api/doors.py).
        peers = [{"name": body["door"], "address": body["peer_address"]}]
        return self._answer(200, {"peers": peers if body.get("peer_address") else []})


def test_the_door_s_container_starts_with_its_token_alone_and_is_ready_while_its_lease_holds(
    tmp_path,
):
    """The door's own command and environment as the manifest gives them (no
    ConfigMap, no Secret of the application; its name from the pod, its
    token and certificate where the Secrets' volumes put them), against a
    stand-in control plane: the agent pulls the state, starts a real HAProxy,
    acknowledges it, and /door/ready answers 200 over TLS, and the exporter
    on its port; once the control plane stops answering, /door/ready answers
    503 within the lease (which is what takes the pod out of the Service)."""
    if shutil.which("haproxy") is None:
        if os.environ.get("REQUIRE_DEPLOY_TOOLS") == "1":
            pytest.fail("haproxy is required (scripts/test.sh installs it)")
        pytest.skip("haproxy not installed")
    import requests

    from serving.door.callers import DoorAccess
    from serving.door.routing import RoutingTable
    from serving.door.state import DoorDocument, encode
    from tests.support.vllm_servers import free_port

    door, container = door_container(build("base"))
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    # What the kubelet gives from the pod (its name, its IP), and the
    # $(VAR) references it expands with them.
    from_pod = {"DOOR_NAME": "door-0", "POD_IP": "127.0.0.1"}
    for entry in container["env"]:
        assert "value" in entry or entry["name"] in from_pod, entry
        value = entry.get("value", from_pod.get(entry["name"]))
        env[entry["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], value)
    assert not APPLICATION_SECRETS & set(env)
    # Where the pod's volumes are, here: the emptyDir, the Secrets' files,
    # free ports instead of 8080 and 8404.
    token = "a-door-token"
    token_file = tmp_path / "door-credential" / Path(env["DOOR_TOKEN_FILE"]).name
    token_file.parent.mkdir()
    token_file.write_text(token + "\n")
    mounted = tls_secret_mount(door, tmp_path / "door-tls")
    port, metrics = free_port(), free_port()
    lease = 2.0
    document = DoorDocument(
        RoutingTable(env["DOOR_DEPLOYMENT"], "base", (), {}),
        DoorAccess(env["DOOR_DEPLOYMENT"]),
        lease_seconds=lease,
    )
    control_plane = StandInControlPlane(token, encode(document))
    threading.Thread(target=control_plane.serve_forever, daemon=True).start()
    env.update(
        PATH=f"{Path(sys.executable).parent}:{env['PATH']}",
        DOOR_CONTROL_PLANE=control_plane.url,
        DOOR_TOKEN_FILE=str(token_file),
        DOOR_DIR=str(tmp_path / "gateway"),
        DOOR_LISTEN=f"127.0.0.1:{port}",
        DOOR_METRICS=f"127.0.0.1:{metrics}",
        DOOR_CERTIFICATE=str(mounted.root / Path(env["DOOR_CERTIFICATE"]).name),
        DOOR_PEER_ADDRESS=f"127.0.0.1:{free_port()}",
    )
    probe = container["readinessProbe"]["httpGet"]
    ready = f"{probe['scheme'].lower()}://127.0.0.1:{port}{probe['path']}"
    log_path = tmp_path / "door.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            container["command"],
            cwd=ROOT.parents[1],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def readiness() -> int | None:
        try:
            return requests.get(ready, verify=str(mounted.authority.ca), timeout=2).status_code
        except requests.RequestException:
            return None

    try:
        deadline = time.monotonic() + 60
        while readiness() != 200:
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)
        # Its acknowledgement follows once the state is applied.
        while {"door": "door-0", "generation": 1} not in [
            {k: ack[k] for k in ("door", "generation")} for ack in control_plane.acks
        ]:
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        exported = requests.get(f"http://127.0.0.1:{metrics}/metrics", timeout=5)
        assert "haproxy_process_" in exported.text
        # It gives its peers address, and runs HAProxy as a peer named for the pod.
        assert control_plane.acks[-1]["peer_address"] == env["DOOR_PEER_ADDRESS"]
        config = (tmp_path / "gateway" / "haproxy.cfg").read_text()
        assert f"    peer door-0 {env['DOOR_PEER_ADDRESS']}\n" in config
        control_plane.answering = False
        stopped = time.monotonic()
        while readiness() != 503:
            assert time.monotonic() - stopped < lease + 3, log_path.read_text()
            time.sleep(0.2)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(40)
        control_plane.shutdown()


def _config(objects) -> dict:
    return named(objects, "ConfigMap")["lora-registry-config"]["data"]


def test_trusted_proxy_count_is_set_where_a_router_stands_in_front(built):
    """Behind a router every client has the router's address: without the
    count, one stranger's failed sign-ins lock everyone out (issue 43)."""
    target, objects = built
    routers = named(objects, "Route") | named(objects, "Ingress")
    count = int(_config(objects).get("TRUSTED_PROXY_COUNT", "0"))
    assert count == (1 if routers else 0), target
    if target == "overlays/openshift":
        assert routers


def test_the_replicas_span_exporter_reaches_the_web_service_by_its_cluster_name(built):
    """serving/kserve.py points each replica at
    lora-registry-web.<KSERVE_CONTROL_PLANE_NAMESPACE>.svc: that Host must be allowed."""
    target, objects = built
    data = _config(objects)
    namespace = data["KSERVE_CONTROL_PLANE_NAMESPACE"]
    if target != "base":
        # The overlay's namespace is where its web Service is.
        assert named(objects, "Service")["lora-registry-web"]["metadata"]["namespace"] == namespace
    hosts = data["DJANGO_ALLOWED_HOSTS"].split(",")
    assert f"lora-registry-web.{namespace}.svc" in hosts, target


def pod_selector(obj: dict) -> dict:
    """The label selector of a Service, PodDisruptionBudget or NetworkPolicy."""
    if obj["kind"] == "Service":
        return {"matchLabels": obj["spec"]["selector"]}
    if obj["kind"] == "NetworkPolicy":
        return obj["spec"]["podSelector"]
    return obj["spec"]["selector"]


def test_two_base_models_each_behind_two_doors(tmp_path):
    """The recipe of docs/operators/deployment.md ("Two base models, each
    behind two doors"), run as written on a copy of deploy/ (up to the
    Secret, which needs a cluster), then built: two door Deployments of two
    doors, whose pods no other one selects, each pulling its own deployment
    with its own token, every object valid."""
    doc = (ROOT.parents[1] / "docs" / "operators" / "deployment.md").read_text()
    section = doc.split("#### Two base models, each behind two doors", 1)[1]
    script = section.split("```sh\n", 1)[1].split("```", 1)[0]
    script = script.split("kubectl create secret", 1)[0]
    shutil.copytree(ROOT.parent, tmp_path / "deploy")
    subprocess.run(["bash", "-euc", script], cwd=tmp_path, check=True, timeout=60)
    result = subprocess.run(
        [kubectl(), "kustomize", str(tmp_path / "deploy/kustomize/overlays/two-models")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    objects = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    doors = {
        name: d
        for name, d in named(objects, "Deployment").items()
        if d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == "gateway"
    }
    assert set(doors) == {DOOR, f"{DOOR}-llama"}
    config = _config(objects)
    pulling = dict(item.split("=", 1) for item in config["SERVING_DOORS"].split(","))
    assert pulling == {"granite": "pull", "llama": "pull"}
    deployments = set()
    for name, door in doors.items():
        assert door["spec"]["replicas"] >= 2
        (container,) = door["spec"]["template"]["spec"]["containers"]
        deployment = env_of(container)["DOOR_DEPLOYMENT"]["value"]
        deployments.add(deployment)
        (credential,) = [
            v for v in door["spec"]["template"]["spec"]["volumes"] if v["name"] == "door-credential"
        ]
        assert credential["secret"]["items"] == [{"key": deployment, "path": "token"}]
        # Its Service, budget and policy select its own pods, never the other's.
        for kind in ("Service", "PodDisruptionBudget", "NetworkPolicy"):
            selector = pod_selector(named(objects, kind)[name])
            selected = {
                n
                for n, d in doors.items()
                if matches(selector, d["spec"]["template"]["metadata"]["labels"])
            }
            assert selected == {name}, (kind, name)
    assert deployments == {"granite", "llama"}
