"""The kustomize base runs each process role the way docker-compose.yml does,
which the compose tier (tests/compose) starts for real: the same image, command,
user, read-only root, secrets and health checks, role by role, so the two
cannot drift apart unseen.

A difference by design, checked as such: Kubernetes hands a role its secrets
as environment variables (`secretKeyRef`, one key each), Compose as files
(`*_FILE` under /run/secrets), and the set per role is compared. The doors run
alike on both: HAProxy with its agent, pulling its state from web
(docs/door.md#doors-that-pull); Compose runs two, peers, in plain HTTP."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tests.deploy.test_compose import compose
from tests.deploy.test_kustomize import build

REPO = Path(__file__).resolve().parents[2]
ROLES = [
    "migrate",
    "web",
    "worker-rollouts",
    "worker-reconcile",
    "worker-housekeeping",
    "beat",
    "gateway",
]
# The broker URL is a secret in Kubernetes (it carries Redis's password); the
# compose Redis has none, so Compose passes it as plain environment.
K8S_ONLY_SECRETS = {"CELERY_BROKER_URL"}


@pytest.fixture(scope="module")
def k8s() -> dict[str, dict]:
    """role -> {container, pod spec, configmap} from the rendered base."""
    docs = build("base")
    config = next(d["data"] for d in docs if d["kind"] == "ConfigMap")
    found = {}
    for doc in docs:
        if doc["kind"] not in ("Deployment", "Job"):
            continue
        pod = doc["spec"]["template"]["spec"]
        for container in pod["containers"]:
            env = {e["name"]: e for e in container.get("env", [])}
            role = env.get("PROCESS_ROLE", {}).get("value")
            if role in ROLES:
                found[role] = {"container": container, "pod": pod, "config": config}
    assert set(found) == set(ROLES)
    return found


@pytest.fixture(scope="module")
def services() -> dict:
    return yaml.safe_load(compose("config"))["services"]


def _image_cmd() -> list[str]:
    text = (REPO / "Dockerfile").read_text()
    cmd = re.search(r"^CMD (\[.*?\])\s*$", text, re.M | re.S)
    assert cmd, "the Dockerfile has no CMD"
    return json.loads(cmd.group(1).replace("\\\n", ""))


def _compose_command(service: dict) -> list[str]:
    entrypoint = service.get("entrypoint") or []
    command = service.get("command")
    if command is None:
        command = _image_cmd()
    # `docker-compose config` keeps the file's escaping: $$ is the shell's $.
    return [w.replace("$$", "$") for w in [*entrypoint, *command]]


def _normalised(words: list[str]) -> list[str]:
    # The demo deployment's name and base model differ by design (local-cpu and
    # the tiny test model in Compose, the ConfigMap's in Kubernetes).
    subs = [
        ('"$DOOR_DEPLOYMENT"', "<deployment>"),
        ("local-cpu", "<deployment>"),
        ('"$DOOR_BASE_MODEL"', "<base-model>"),
        ('"${VLLM_SERVED_MODEL_NAME:-tiny-llama}"', "<base-model>"),
        ('"$DATABASE_APP_ROLE"', "registry_app"),
    ]
    out = []
    for word in words:
        for old, new in subs:
            word = word.replace(old, new)
        out.append(" ".join(word.split()))
    return out


@pytest.mark.parametrize("role", ROLES)
def test_each_role_runs_the_same_image_command_and_user(k8s, services, role):
    container, pod = k8s[role]["container"], k8s[role]["pod"]
    service = services[role]
    assert container["image"].rsplit("/", 1)[-1].split(":")[0] == service["image"].split(":")[0]
    k8s_command = [*container.get("command", []), *container.get("args", [])]
    assert _normalised(k8s_command) == _normalised(_compose_command(service))
    assert pod["securityContext"]["runAsUser"] == 10001
    assert "user" not in service  # the image's USER 10001
    assert "USER 10001" in (REPO / "Dockerfile").read_text().splitlines()
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert service["read_only"] is True
    assert service["environment"]["PROCESS_ROLE"] == role


@pytest.mark.parametrize("role", ROLES)
def test_each_role_gets_the_same_secrets(k8s, services, role):
    container = k8s[role]["container"]
    from_k8s = {
        e["name"]
        for e in container.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
        and not e["valueFrom"]["secretKeyRef"].get("optional")
    } - K8S_ONLY_SECRETS
    env = services[role]["environment"]
    from_compose = {
        k.removesuffix("_FILE")
        for k, v in env.items()
        if k.endswith("_FILE") and str(v).startswith("/run/secrets/")
    }
    # The AWS key is optional in Kubernetes (a pod may use the platform's own
    # credentials); Compose always gives the MinIO key.
    assert from_k8s == from_compose - {"AWS_SECRET_ACCESS_KEY"}
    mounted = {s["source"] if isinstance(s, dict) else s for s in services[role].get("secrets", [])}
    assert len(mounted) == len(from_compose)


def _compose_check(service: dict) -> list[str]:
    test = service["healthcheck"]["test"]
    assert test[0] == "CMD"
    return test[1:]


@pytest.mark.parametrize("role", ["worker-rollouts", "worker-reconcile", "worker-housekeeping"])
def test_a_worker_is_judged_alive_by_the_same_check(k8s, services, role):
    probe = k8s[role]["container"]["livenessProbe"]
    assert probe["exec"]["command"] == _compose_check(services[role])
    health = services[role]["healthcheck"]
    assert probe["periodSeconds"] == int(health["interval"].rstrip("s"))
    assert probe["failureThreshold"] == health["retries"]


def test_web_is_ready_on_readyz_and_the_door_on_its_port(k8s, services):
    ready = k8s["web"]["container"]["readinessProbe"]["httpGet"]
    assert ready["path"] == "/readyz"
    assert {"name": "Host", "value": "localhost"} in ready["httpHeaders"]
    check = " ".join(_compose_check(services["web"]))
    assert "/readyz" in check and "'Host':'localhost'" in check
    door = k8s["gateway"]["container"]
    ports = {p["name"]: p["containerPort"] for p in door["ports"]}
    probe = door["readinessProbe"]["httpGet"]
    assert ports[probe["port"]] == 8080
    # The same path, over plain HTTP in Compose (no DOOR_CERTIFICATE there).
    check = " ".join(_compose_check(services["gateway"]))
    assert f"'http://127.0.0.1:8080{probe['path']}'" in check


def test_the_doors_pull_on_kubernetes_and_in_compose(k8s, services):
    """The door: the agent of a deployment whose doors pull, on both sides, with
    the same variables but for what differs by design: Kubernetes names a door
    by its pod and serves TLS and metrics; Compose names its two doors by their
    services and makes them peers (fixed names), in plain HTTP."""
    container = k8s["gateway"]["container"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    doors = dict(i.split("=", 1) for i in k8s["gateway"]["config"]["SERVING_DOORS"].split(","))
    assert doors[env["DOOR_DEPLOYMENT"]] == "pull"
    for name in ("gateway", "gateway-b"):
        service = services[name]
        assert _compose_command(service) == container["command"], name
        door_env = service["environment"]
        compose_doors = dict(
            i.split("=", 1) for i in services["web"]["environment"]["SERVING_DOORS"].split(",")
        )
        assert compose_doors[door_env["DOOR_DEPLOYMENT"]] == "pull", name
        # Peers: Compose lists its two doors by their fixed names (DOOR_PEERS);
        # Kubernetes, whose pods have none, lists none or finds them through
        # the control plane (DOOR_PEER_ADDRESS, from the pod's IP).
        peers = {"DOOR_PEERS", "DOOR_PEER_ADDRESS", "POD_IP"}
        assert set(door_env) - peers == set(env) - peers - {"DOOR_CERTIFICATE", "DOOR_METRICS"}
        for variable in ("PROCESS_ROLE", "DOOR_DIR", "DOOR_LISTEN", "DOOR_LEASE_SECONDS"):
            assert door_env[variable] == env[variable], (name, variable)
        # The web service, in clear, on its port.
        assert door_env["DOOR_CONTROL_PLANE"].rsplit(":", 1)[1] == "8000"
        assert env["DOOR_CONTROL_PLANE"].rsplit(":", 1)[1] == "8000"
        assert door_env["DOOR_CONTROL_PLANE"].startswith("http://")
        assert env["DOOR_CONTROL_PLANE"].startswith("http://")
