"""The kustomize base runs each process role the way docker-compose.yml does,
which the compose tier (tests/compose) starts for real: the same image, command,
user, read-only root, secrets and health checks, role by role, so the two
cannot drift apart unseen.

Two differences are by design and checked as such: Kubernetes hands a role its
secrets as environment variables (`secretKeyRef`, one key each), Compose as
files (`*_FILE` under /run/secrets), and the set per role is compared; and the
door: on a cluster each door is HAProxy with its agent, pulling its state from
web (docs/door.md#doors-that-pull), while Compose still runs one door on one
machine that the workers drive through its socket."""

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


# The door runs another command on each side (the module docstring).
SAME_COMMAND = [role for role in ROLES if role != "gateway"]


@pytest.mark.parametrize("role", SAME_COMMAND)
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
    assert ports[door["readinessProbe"]["httpGet"]["port"]] == 8080
    assert "('127.0.0.1',8080)" in " ".join(_compose_check(services["gateway"]))


def test_the_door_pulls_on_kubernetes_and_is_driven_in_compose(k8s, services):
    """The one comparison by design: the same image, user and read-only root,
    no secret on either side, but Kubernetes runs the agent of a deployment
    whose doors pull, Compose one door the workers drive through its socket.
    When Compose pulls too, this fails: compare the commands then."""
    container, pod = k8s["gateway"]["container"], k8s["gateway"]["pod"]
    service = services["gateway"]
    assert container["image"].rsplit("/", 1)[-1].split(":")[0] == service["image"].split(":")[0]
    assert pod["securityContext"]["runAsUser"] == 10001 and "user" not in service
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert service["read_only"] is True
    assert container["command"] == ["python", "-m", "serving.door.agent"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    doors = dict(i.split("=", 1) for i in k8s["gateway"]["config"]["SERVING_DOORS"].split(","))
    assert doors[env["DOOR_DEPLOYMENT"]] == "pull"
    command = " ".join(_compose_command(service))
    assert "door_sync" in command and "serving.door.agent" not in command
    compose_doors = dict(
        i.split("=", 1) for i in service["environment"]["SERVING_DOORS"].split(",")
    )
    assert "pull" not in compose_doors.values()
