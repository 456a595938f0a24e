"""The compose tier: docker-compose.yml started under podman from the images
scripts/compose/build.sh built (`make compose-test`, docs/operators/deployment.md).

One stack for the module, in order: it starts and turns healthy; the product's
containers run as shipped (UID 10001, read-only root, secrets as files, their
PROCESS_ROLE); a newcomer's steps against the published ports (sign in, a
pipeline token, upload, submit, approve); the two doors of the demo deployment
pulling their state from web, each refusing a request without a key on its own
published port and acknowledged at the control plane; a worker container killed
and the stack converging; one door restarted and healthy again while the other
keeps answering; `down -v` leaving nothing. Times are printed (start to ready,
each fault's recovery).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests
from packaging.utils import canonicalize_name

from tests.compose.stack import PROJECT, REPO, Stack, podman
from tests.support.adapters import AdapterSpec, adapter_tar_gz

pytestmark = [pytest.mark.compose]

WEB = "http://127.0.0.1:8000"
# The demo deployment's doors (docker-compose.yml): service -> published port.
DOORS = {"gateway": 8080, "gateway-b": 8081}
PRODUCT = [
    "migrate",
    "web",
    "worker-rollouts",
    "worker-reconcile",
    "worker-housekeeping",
    "beat",
    "door-credential",
    "gateway",
    "gateway-b",
]
# Each service's PROCESS_ROLE (config/roles.py): its own name but for the doors.
ROLE = {service: service for service in PRODUCT} | {door: "gateway" for door in DOORS}
LONG_RUNNING = [
    "web",
    "worker-rollouts",
    "worker-reconcile",
    "worker-housekeeping",
    "gateway",
    "gateway-b",
]
# The secret files each role mounts (docker-compose.yml, config/roles.py).
SECRETS = {
    "migrate": {"migrate_database_url"},
    "web": {"django_secret_key", "field_encryption_key", "database_url", "s3_secret_key"},
    "worker-rollouts": {"field_encryption_key", "database_url", "s3_secret_key"},
    "worker-reconcile": {"field_encryption_key", "database_url", "s3_secret_key"},
    "worker-housekeeping": {
        "django_secret_key",
        "field_encryption_key",
        "database_url",
        "s3_secret_key",
    },
    "beat": set(),
    # The doors' token is derived from the secret key; the doors get neither.
    "door-credential": {"django_secret_key"},
    "gateway": set(),
    "gateway-b": set(),
}
FIGURES: dict[str, float] = {}


def _figure(name: str, seconds: float) -> None:
    FIGURES[name] = seconds
    print(f"compose figure: {name}: {seconds:.1f} s")
    path = os.environ.get("COMPOSE_FIGURES")
    if path:
        Path(path).write_text(json.dumps(FIGURES, indent=2))


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    if subprocess.run(
        ["podman", "image", "exists", "localhost/lora-adapter-registry:local"]
    ).returncode:
        pytest.fail("no product image: scripts/compose/test.sh builds it (make compose-test)")
    subprocess.run(
        ["bash", str(REPO / "scripts/compose-secrets.sh")], check=True, capture_output=True
    )
    s = Stack(tmp_path_factory.mktemp("compose"))
    with s.running():
        s.down()  # what an interrupted run left
        started = time.monotonic()
        s.compose("up", "-d", timeout=900)
        s.wait_healthy([x for x in LONG_RUNNING if x not in DOORS], timeout=600)
        # The doors have no state before their deployment exists (nothing
        # listens): what `register_local_deployment` does once vLLM runs, here
        # without one (the tier starts no replica).
        s.exec("web", "python", "manage.py", "shell", "-c", REGISTER)
        s.wait_healthy(list(DOORS), timeout=180)
        _figure("up to every service healthy", time.monotonic() - started)
        yield s


# local-cpu as register_local_deployment records it, by a platform admin. Its
# replica is an address where nothing listens: the tier starts no vLLM, and a
# name that does not resolve (vllm-cpu, not started) fails HAProxy's whole
# configuration (it resolves every server's address at start and reload).
REGISTER = (
    "from django.contrib.auth import get_user_model\n"
    "from core.actors import system_actor\n"
    "from serving.models import Deployment\n"
    "from serving.services.deployments import deployment_create\n"
    "admin, _ = get_user_model().objects.get_or_create("
    "username='compose-admin', defaults={'is_staff': True})\n"
    "if not Deployment.objects.filter(name='local-cpu').exists():\n"
    "    deployment_create(actor=system_actor(admin), name='local-cpu', environment='local',"
    " base_model_name='tiny-llama',"
    " replica_urls=['http://127.0.0.1:8100'],"
    " volume_write_path='/mnt/adapters', volume_serve_path='/mnt/adapters')\n"
)
# The doors the control plane holds live for local-cpu (serving/door/fleet.py
# live_doors: heard from within their lease) with the generation each
# acknowledged, and the deployment's current generation.
LIVE_DOORS = (
    "import json\n"
    "from serving.door.fleet import live_doors\n"
    "from serving.models import Deployment, DoorState\n"
    "d = Deployment.objects.get(name='local-cpu')\n"
    "print(json.dumps({'generation': DoorState.objects.get(deployment=d).generation,"
    " 'doors': {x.name: x.applied_generation for x in live_doors(d)}}))\n"
)


def _secret(name: str) -> str:
    return (REPO / "secrets" / name).read_text().strip()


def test_the_migration_ran_once_and_exited_zero(stack):
    state = stack.container("migrate")["State"]
    assert state["Status"] == "exited" and state["ExitCode"] == 0, state


@pytest.mark.parametrize("service", PRODUCT)
def test_product_service_runs_as_shipped(stack, service):
    c = stack.container(service)
    config, host = c["Config"], c["HostConfig"]
    assert config["Image"].endswith("lora-adapter-registry:local")
    assert config["User"] == "10001"
    assert host["ReadonlyRootfs"] is True
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["PROCESS_ROLE"] == ROLE[service]
    mounted = {
        Path(m["Destination"]).name
        for m in c["Mounts"]
        if m["Destination"].startswith("/run/secrets/")
    }
    assert mounted == SECRETS[service]
    # Secrets as files only: no value of any secret in the environment.
    values = {p.name: p.read_text().strip() for p in (REPO / "secrets").iterdir()}
    leaked = [k for k, v in env.items() if any(len(s) > 8 and s in v for s in values.values())]
    assert not leaked, f"{service}: a secret's value in the environment: {leaked}"


def test_a_process_runs_as_uid_10001_and_cannot_write_its_root(stack):
    out = stack.exec(
        "web",
        "sh",
        "-c",
        "id -u; touch /app/x 2>&1 || true; touch /var/lib/registry/x /tmp/x && echo tmp-ok",
    ).stdout
    lines = out.strip().splitlines()
    assert lines[0] == "10001"
    assert "Read-only file system" in out
    assert lines[-1] == "tmp-ok"


def test_the_image_ships_var_dir_empty():
    # Podman copies the image's content into a tmpfs mounted over it, owners
    # lost: a root-owned ingest/ there made every upload a Permission denied.
    listed = podman(
        "run",
        "--rm",
        "--entrypoint",
        "ls",
        "localhost/lora-adapter-registry:local",
        "-A",
        "/var/lib/registry",
    )
    assert listed.stdout.split() == []


@pytest.mark.parametrize("service", ["web", "worker-rollouts", "gateway", "gateway-b", "beat"])
def test_nothing_tries_to_write_the_read_only_root(stack, service):
    # gunicorn 27's control server wrote under $HOME (/home/registry, read-only):
    # the image sets HOME=/tmp.
    logs = stack.logs(service, tail=2000)
    assert "Read-only file system" not in logs, logs[-3000:]


def test_the_image_carries_the_pinned_haproxy_and_python_packages(stack):
    banner = stack.exec("gateway", "haproxy", "-v").stdout
    assert re.match(r"HA-?Proxy version 2\.6\.", banner), banner
    frozen = stack.exec("web", "pip", "freeze", "--disable-pip-version-check").stdout.split()

    def pin(line: str) -> tuple[str, str]:
        name, _, version = line.partition("==")
        return canonicalize_name(name), version

    pins = dict(
        pin(line)
        for line in (REPO / "deploy/docker/constraints.txt").read_text().split()
        if "==" in line
    )
    unpinned = [
        line
        for line in frozen
        if pin(line)[0] not in {"pip", "setuptools"} and pins.get(pin(line)[0]) != pin(line)[1]
    ]
    assert not unpinned, f"in the image but not pinned in constraints.txt: {unpinned}"


def _login(user: str) -> requests.Session:
    session = requests.Session()
    session.get(f"{WEB}/login/", timeout=30).raise_for_status()
    response = session.post(
        f"{WEB}/login/",
        data={
            "csrfmiddlewaretoken": session.cookies["csrftoken"],
            "username": user,
            "password": "demo-password",
        },
        headers={"Referer": f"{WEB}/login/"},
        allow_redirects=False,
        timeout=30,
    )
    assert response.status_code == 302, response.text[:500]
    session.headers.update({"X-CSRFToken": session.cookies["csrftoken"], "Referer": f"{WEB}/"})
    return session


def test_a_newcomer_uploads_submits_and_approves_through_the_published_port(stack, tmp_path):
    stack.exec("web", "python", "manage.py", "seed_demo")
    # The pipeline's archive, made on its own machine: the one `make run`'s
    # seed_demo writes for legal/contracts v1 (the image has no test helpers).
    archive = tmp_path / "legal-contracts-v1.tar.gz"
    archive.write_bytes(adapter_tar_gz(AdapterSpec(seed=101, base_model="tiny-llama")))

    member = _login("legal-member")
    token = member.post(
        f"{WEB}/api/v1/tokens/",
        json={
            "department": "legal",
            "name": "compose",
            "abilities": ["versions:register", "versions:submit"],
        },
        timeout=30,
    )
    assert token.status_code == 201, token.text
    cli = REPO / ".venv/bin/lora-registry"
    env = dict(os.environ, LORA_REGISTRY_URL=WEB, LORA_REGISTRY_TOKEN=token.json()["secret"])
    registered = subprocess.run(
        [str(cli), "register", "legal/contracts", str(archive), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert registered.returncode == 0, registered.stderr
    version = json.loads(registered.stdout)
    assert version["status"] == "registered"
    submitted = subprocess.run(
        [str(cli), "submit", str(version["id"]), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert submitted.returncode == 0, submitted.stderr
    assert json.loads(submitted.stdout)["status"] == "pending_review"
    approved = _login("legal-approver").post(
        f"{WEB}/api/v1/versions/{version['id']}/approve/",
        json={"comment": "in containers"},
        timeout=30,
    )
    assert approved.status_code == 200, approved.text
    assert approved.json()["status"] == "approved"
    # The archive went to the S3 server, not to a path in the container.
    listed = stack.exec(
        "web",
        "python",
        "-c",
        "import boto3; key = open('/run/secrets/s3_secret_key').read().strip();"
        "s3 = boto3.client('s3', aws_access_key_id='registry',"
        " aws_secret_access_key=key, region_name='us-east-1');"
        "print(s3.list_objects_v2(Bucket='adapters').get('KeyCount'))",
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    assert int(listed.stdout.strip()) >= 1


def test_a_worker_container_killed_is_replaced_and_the_stack_converges(stack):
    state = stack.container("worker-rollouts")["State"]
    # Its process killed from the host, as the kernel's OOM killer would: a
    # crash. (`podman kill` is a user's stop, which the restart policy honours.)
    os.kill(state["Pid"], signal.SIGKILL)
    started = time.monotonic()
    # restart: unless-stopped (docker-compose.yml) brings it back.
    deadline = time.monotonic() + 120
    while stack.container("worker-rollouts")["State"]["StartedAt"] == state["StartedAt"]:
        assert time.monotonic() < deadline, "the killed worker was not restarted"
        time.sleep(1)
    stack.wait_healthy(["worker-rollouts"], timeout=240)
    _figure("killed worker back and healthy", time.monotonic() - started)


def _unkeyed(port: int) -> requests.Response:
    return requests.post(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        json={"model": "legal-contracts", "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )


def _live_doors(stack) -> dict:
    out = stack.exec("web", "python", "manage.py", "shell", "-c", LIVE_DOORS).stdout
    # The last line: Django's shell may say what it imported first.
    return json.loads(out.strip().splitlines()[-1])


def _wait_acknowledged(stack, timeout: float = 60) -> dict:
    """Both doors live at the control plane, each having acknowledged the
    deployment's current generation."""
    deadline = time.monotonic() + timeout
    while True:
        seen = _live_doors(stack)
        acked = {name: g for name, g in seen["doors"].items() if g == seen["generation"]}
        if set(acked) == set(DOORS) and seen["generation"] >= 1:
            return seen
        assert time.monotonic() < deadline, f"not both doors live and acknowledged: {seen}"
        time.sleep(2)


@pytest.mark.parametrize("door", DOORS)
def test_each_door_refuses_a_request_without_a_key_itself(stack, door):
    # Through its published port: HAProxy's own 401 (no key), in OpenAI's shape.
    response = _unkeyed(DOORS[door])
    assert response.status_code == 401, response.text[:300]
    assert "error" in response.json(), response.text[:300]
    assert stack.container(door)["HostConfig"]["PortBindings"]["8080/tcp"][0]["HostPort"] == str(
        DOORS[door]
    )


def test_both_doors_pull_their_state_and_are_acknowledged_at_the_control_plane(stack):
    seen = _wait_acknowledged(stack)
    assert set(seen["doors"]) == {"gateway", "gateway-b"}, seen
    for door in DOORS:
        # Its token: door-credential's file, 0600 and the door's own UID, read-only.
        token = stack.exec(
            door,
            "sh",
            "-c",
            "stat -c '%a %u' /etc/door-credential/token; touch /etc/door-credential/x 2>&1 || true",
        ).stdout
        assert token.splitlines()[0] == "600 10001", token
        assert "Read-only file system" in token, token
        # Each door's HAProxy talks the peers protocol with the other (DOOR_PEERS).
        config = stack.exec(door, "sh", "-c", "cat /var/run/gateway/haproxy.cfg").stdout
        assert "peer gateway gateway:10000" in config, config[-2000:]
        assert "peer gateway-b gateway-b:10000" in config, config[-2000:]


def test_one_door_restarted_comes_back_while_the_other_answers(stack):
    refused: list[int] = []
    stop = threading.Event()

    def other_door() -> None:
        while not stop.is_set():
            try:
                refused.append(_unkeyed(DOORS["gateway"]).status_code)
            except requests.RequestException:
                refused.append(0)
            time.sleep(0.25)

    watcher = threading.Thread(target=other_door, daemon=True)
    watcher.start()
    started = time.monotonic()
    try:
        stack.compose("restart", "-t", "20", "gateway-b", timeout=120)
        stack.wait_healthy(["gateway-b"], timeout=180)
        _figure("door restarted and healthy", time.monotonic() - started)
    finally:
        stop.set()
        watcher.join(timeout=40)
    # The other door answered throughout, every time with its own 401.
    assert refused and set(refused) == {401}, refused
    assert _unkeyed(DOORS["gateway-b"]).status_code == 401
    _wait_acknowledged(stack)


def test_a_stop_signal_stops_each_long_running_service_in_time(stack):
    # podman's stop sends SIGTERM, then SIGKILL after the timeout: a process that
    # passed the signal on exits on its own, well within it. The doors first,
    # while web answers: a door's agent ends the exchange it is in before it
    # stops HAProxy (up to its HTTP timeout when web is away, as just after
    # web's own restart).
    for service in ("gateway", "gateway-b", "web", "worker-housekeeping"):
        started = time.monotonic()
        stack.compose("stop", "-t", "30", service, timeout=120)
        took = time.monotonic() - started
        state = stack.container(service)["State"]
        assert took < 25, (
            f"{service} took {took:.0f} s to stop: the signal did not reach it\n"
            + stack.compose("logs", "--no-color", "-t", "--tail=60", service, check=False).stdout
        )
        _figure(f"{service} stopped on SIGTERM", took)
        assert state["ExitCode"] != 137, f"{service} was killed, not stopped: {state}"
        stack.compose("start", service, timeout=120)
    stack.wait_healthy(["web", "worker-housekeeping", *DOORS], timeout=240)


def test_down_v_leaves_nothing(stack):
    stack.down()
    assert stack.containers() == []
    volumes = podman(
        "volume", "ls", "-q", "--filter", f"label=com.docker.compose.project={PROJECT}"
    ).stdout
    assert volumes.split() == []
    networks = podman("network", "ls", "--format", "{{.Name}}").stdout.split()
    assert f"{PROJECT}_default" not in networks
