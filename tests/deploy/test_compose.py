"""docker-compose.yml, as `docker-compose config` resolves it (Debian's
docker-compose; no container engine here, so nothing is started), and the
script that writes its secret files."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import yaml
from django.conf import settings

from config import roles
from observability.otlp import metering_token
from tests.deploy.startup import settings_started

REPO = Path(__file__).resolve().parents[2]
QUEUES = {"rollouts", "reconcile", "housekeeping"}
REGISTRY = {"migrate", "web", "beat"} | {f"worker-{q}" for q in QUEUES}
# The demo deployment's two doors (docs/door.md#doors-that-pull), by service
# name, their published port, and the one-shot service that writes their token.
DOORS = {"gateway": "8080", "gateway-b": "8081"}
CREDENTIAL = "door-credential"
PRODUCT = REGISTRY | set(DOORS) | {CREDENTIAL}


def compose(*args: str) -> str:
    found = shutil.which("docker-compose")
    if found is None:
        if os.environ.get("REQUIRE_DEPLOY_TOOLS") == "1":
            pytest.fail("docker-compose is required (scripts/test.sh installs it)")
        pytest.skip("docker-compose not installed (scripts/test.sh installs it)")
    result = subprocess.run(
        [found, "-f", str(REPO / "docker-compose.yml"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def services() -> dict:
    resolved = yaml.safe_load(compose("--profile", "cpu", "--profile", "gpu", "config"))
    return resolved["services"]


def test_it_validates_and_has_every_part(services):
    assert set(services) == REGISTRY | {
        "postgres",
        "redis",
        "minio",
        "minio-buckets",
        "mlflow",
        "gateway",
        "gateway-b",
        "door-credential",
        "vllm-cpu",
        "vllm-cpu-b",
        "vllm-gpu",
    }


def test_vllm_services_sit_behind_profiles_and_the_gpu_one_reserves_a_gpu(services):
    assert services["vllm-cpu"]["profiles"] == ["cpu"]
    assert services["vllm-gpu"]["profiles"] == ["gpu"]
    devices = services["vllm-gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    args = services["vllm-gpu"]["command"]
    assert "--enable-lora" in args
    assert not any("lora-extra-vocab-size" in a for a in args)
    for name in ("vllm-cpu", "vllm-gpu"):
        assert "adapter-volume:/mnt/adapters:ro" in _volumes(services[name])


def test_a_worker_per_queue_gunicorn_web_and_one_beat(services):
    for queue in QUEUES:
        command = services[f"worker-{queue}"]["command"]
        assert command[:4] == ["celery", "-A", "config", "worker"]
        assert f"--queues={queue}" in command
        assert "adapter-volume:/mnt/adapters:rw" in _volumes(services[f"worker-{queue}"])
    assert "command" not in services["web"]  # the image's: gunicorn
    dockerfile = (REPO / "Dockerfile").read_text()
    assert 'CMD ["gunicorn", "config.wsgi:application"' in dockerfile
    assert "gunicorn" in (REPO / "requirements.txt").read_text()
    assert services["beat"]["command"][:4] == ["celery", "-A", "config", "beat"]
    assert "deploy" not in services["beat"]  # never scaled


def test_no_healthcheck_argument_holds_whitespace(services):
    # podman's Docker-compatible API (4.3, what docker-compose talks to on a
    # podman host) joins a CMD healthcheck's arguments and splits them again on
    # spaces: `python -c "import x; ..."` became `python -c import` and never
    # turned healthy (found by the compose tier, tests/compose).
    for name, service in services.items():
        test = service.get("healthcheck", {}).get("test")
        if not test:
            continue
        assert test[0] == "CMD", name
        assert not [arg for arg in test if any(c.isspace() for c in arg)], (name, test)


def test_healthchecks_and_start_order(services):
    for name in ("postgres", "redis", "minio", "mlflow", "web", "vllm-cpu", "vllm-gpu", *DOORS):
        assert services[name]["healthcheck"]["test"], name
    for queue in QUEUES:
        assert services[f"worker-{queue}"]["healthcheck"]["test"]
    web = services["web"]["depends_on"]
    assert web["postgres"]["condition"] == "service_healthy"
    assert web["redis"]["condition"] == "service_healthy"
    assert web["minio-buckets"]["condition"] == "service_completed_successfully"
    assert web["migrate"]["condition"] == "service_completed_successfully"
    assert web["mlflow"]["condition"] == "service_healthy"
    assert services["minio-buckets"]["depends_on"]["minio"]["condition"] == "service_healthy"
    assert services["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    for queue in QUEUES:
        assert services[f"worker-{queue}"]["depends_on"]["migrate"]["condition"] == (
            "service_completed_successfully"
        )
    # The token first, then the doors (which wait for web themselves: the agent retries).
    assert services[CREDENTIAL]["depends_on"] == {
        "migrate": {"condition": "service_completed_successfully"}
    }
    assert services[CREDENTIAL]["restart"] == "no"
    for door in DOORS:
        assert services[door]["depends_on"] == {
            CREDENTIAL: {"condition": "service_completed_successfully"}
        }, door


def test_two_database_roles_the_migration_owns_the_tables(services):
    migrate = services["migrate"]
    assert "db_grant_app_role registry_app" in " ".join(migrate["command"])
    assert {s if isinstance(s, str) else s["source"] for s in migrate["secrets"]} >= {
        "migrate_database_url"
    }
    for name in PRODUCT - {"migrate"}:
        secrets = {
            s if isinstance(s, str) else s["source"] for s in services[name].get("secrets", [])
        }
        assert "migrate_database_url" not in secrets, name
    init = [v for v in _volumes(services["postgres"]) if "docker-entrypoint-initdb.d" in v]
    assert init and (REPO / "deploy/docker/postgres-app-role.sh").exists()


def test_secrets_come_from_files_never_from_the_file_itself(services):
    text = (REPO / "docker-compose.yml").read_text()
    for name in PRODUCT:
        env = services[name]["environment"]
        for variable in ("DJANGO_SECRET_KEY", "AWS_SECRET_ACCESS_KEY", "FIELD_ENCRYPTION_KEY"):
            assert variable not in env, (name, variable)
        for variable, path in env.items():
            if variable.endswith("_FILE") and variable not in NOT_SECRET_FILES:
                assert path.startswith("/run/secrets/"), (name, variable)
    assert "POSTGRES_PASSWORD:" not in text


# Files that are no secret of the application: the workers' liveness file and
# the doors' token (its own volume, written by door-credential).
NOT_SECRET_FILES = {"WORKER_LIVENESS_FILE", "DOOR_TOKEN_FILE"}
# Which secret file holds which setting (scripts/compose-secrets.sh writes them).
SECRET_FILES = {
    "django_secret_key": "DJANGO_SECRET_KEY",
    "field_encryption_key": "FIELD_ENCRYPTION_KEY",
    "database_url": "DATABASE_URL",
    "s3_secret_key": "AWS_SECRET_ACCESS_KEY",
}
# Compose has no other secret settings: its broker and the S3 user name are not
# secret here, and the optional ones (MLflow token, OIDC, metrics) are unset.
PLAIN = {"CELERY_BROKER_URL", "AWS_ACCESS_KEY_ID"}


def _secrets(service: dict) -> set[str]:
    return {s if isinstance(s, str) else s["source"] for s in service.get("secrets", [])}


def test_each_service_gets_only_the_secret_files_its_process_reads(services):
    """Each registry service names its process (PROCESS_ROLE) and mounts exactly
    the files of the secrets config/roles.py says it reads; the doors none."""
    expected_roles = (
        {name: name for name in REGISTRY}
        | {door: "gateway" for door in DOORS}
        | {CREDENTIAL: "door-credential"}
    )
    for name, role in expected_roles.items():
        service = services[name]
        assert service["environment"]["PROCESS_ROLE"] == role, name
        wanted = {
            ("migrate_database_url" if role == "migrate" else file)
            for file, setting in SECRET_FILES.items()
            if setting in roles.reads(role)
        }
        assert _secrets(service) == wanted, name
        files = {
            v.rsplit("/", 1)[-1]
            for k, v in service["environment"].items()
            if k.endswith("_FILE") and v.startswith("/run/secrets/")
        }
        assert files == wanted, name
        missing = (
            roles.REQUIRED[role] - PLAIN - {SECRET_FILES.get(f, "DATABASE_URL") for f in wanted}
        )
        assert not missing, (name, missing)
    for door in DOORS:
        assert _secrets(services[door]) == set(), door
    # The token's writer reads the secret key alone: no database, no other key.
    assert _secrets(services[CREDENTIAL]) == {"django_secret_key"}
    assert roles.reads("door-credential") == {"DJANGO_SECRET_KEY"}


def test_only_the_web_server_and_the_two_doors_are_published(services):
    published = {
        name: [str(p["published"]) for p in service.get("ports", [])]
        for name, service in services.items()
        if service.get("ports")
    }
    assert published == {"web": ["8000"], "gateway": ["8080"], "gateway-b": ["8081"]}
    # Each door listens on 8080 in its own container.
    for door in DOORS:
        assert [int(p["target"]) for p in services[door]["ports"]] == [8080], door
    assert "ports" not in services["mlflow"]  # no authentication of its own


def test_vllm_requires_the_api_key_the_deployment_is_registered_with(services):
    """Each replica reads the key from the vllm_api_key secret (never a command
    line); the registration the file's header gives sends the same file."""
    for name in ("vllm-cpu", "vllm-cpu-b", "vllm-gpu"):
        # The key, and the metering token (test_every_replica_exports_its_tokens...).
        assert _secrets(services[name]) == {"vllm_api_key", "metering_token"}, name
        assert "--api-key" not in " ".join(services[name].get("command") or []), name
    for name in ("vllm-cpu", "vllm-cpu-b"):
        # The image's CMD, scripts/vllm/serve.sh, reads it into VLLM_API_KEY.
        assert services[name]["environment"]["SERVE_API_KEY_FILE"] == "/run/secrets/vllm_api_key"
    # `config` keeps Compose's $$ escapes; the container's shell sees one $.
    entrypoint = " ".join(services["vllm-gpu"]["entrypoint"]).replace("$$", "$")
    assert 'VLLM_API_KEY="$(cat /run/secrets/vllm_api_key)" exec python3' in entrypoint
    header = (REPO / "docker-compose.yml").read_text().split("services:")[0]
    assert "register_local_deployment" in header
    assert "--api-key-file - < secrets/vllm_api_key" in header


def test_the_secrets_script_writes_each_file_once(tmp_path):
    target = tmp_path / "secrets"
    script = REPO / "scripts" / "compose-secrets.sh"
    subprocess.run(["bash", str(script), str(target)], check=True, capture_output=True)
    files = {p.name: p.read_text() for p in target.iterdir()}
    assert set(files) == {
        "django_secret_key",
        "field_encryption_key",
        "vllm_api_key",
        "postgres_password",
        "s3_secret_key",
        "app_db_password",
        "database_url",
        "migrate_database_url",
        "metering_token",
    }
    assert len(files["django_secret_key"]) >= 50
    assert len(files["field_encryption_key"]) >= 50
    assert files["field_encryption_key"] != files["django_secret_key"]
    assert len(files["vllm_api_key"]) >= 32
    # The migration job owns the tables; everything else is the application role.
    assert files["migrate_database_url"] == (
        f"postgres://registry:{files['postgres_password']}@postgres:5432/registry"
    )
    assert files["database_url"] == (
        f"postgres://registry_app:{files['app_db_password']}@postgres:5432/registry"
    )
    assert stat.S_IMODE(target.stat().st_mode) == 0o700
    subprocess.run(["bash", str(script), str(target)], check=True, capture_output=True)
    assert {p.name: p.read_text() for p in target.iterdir()} == files


def _volumes(service: dict) -> list[str]:
    out = []
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            out.append(volume)
        else:
            suffix = ":ro" if volume.get("read_only") else ""
            out.append(f"{volume['source']}:{volume['target']}{suffix}")
    return out


def test_each_worker_turns_unhealthy_when_it_stops_consuming_its_liveness_ping(services):
    for queue in QUEUES:
        worker = services[f"worker-{queue}"]
        path = worker["environment"]["WORKER_LIVENESS_FILE"]
        assert path.startswith("/tmp/")  # a tmpfs: the root filesystem is read-only
        assert worker["healthcheck"]["test"][:5] == [
            "CMD", "python", "-m", "config.celery_alive", path,
        ]  # fmt: skip
        # The worker still gets every other setting of the registry.
        assert worker["environment"]["CELERY_BROKER_URL"] == "redis://redis:6379/0"


def _peers(value: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in value.split(","))


def test_two_doors_pull_their_state_from_web_and_are_peers(services):
    """Two doors of the demo deployment, each HAProxy with its agent, pulling
    from web (docs/door.md#doors-that-pull), as deploy/kustomize runs them: the
    control plane's side says local-cpu's doors pull, and no worker reaches
    into a door any more (no door directory, no shared socket volume)."""
    for name in REGISTRY:
        env = services[name]["environment"]
        assert env["SERVING_DOORS"] == "local-cpu=pull", name
        assert "SERVING_DOOR_DIR" not in env, name
    assert services[CREDENTIAL]["environment"]["SERVING_DOORS"] == "local-cpu=pull"
    names = set()
    for door, port in DOORS.items():
        service = services[door]
        env = service["environment"]
        assert service["command"] == ["python", "-m", "serving.door.agent"], door
        assert "entrypoint" not in service, door
        assert service["image"] == services["web"]["image"], door
        assert env["DOOR_DEPLOYMENT"] == "local-cpu", door
        assert env["DOOR_CONTROL_PLANE"] == "http://web:8000", door
        assert env["DOOR_LISTEN"] == "0.0.0.0:8080", door
        assert [str(p["published"]) for p in service["ports"]] == [port], door
        # Its name at the control plane and among the peers: its service's.
        assert env["DOOR_NAME"] == door
        names.add(env["DOOR_NAME"])
        # The peers: both doors, by their service names (compose DNS), each
        # talking HAProxy's peers protocol on the same port.
        peers = _peers(env["DOOR_PEERS"])
        assert peers == {name: f"{name}:10000" for name in DOORS}, door
        # Plain HTTP in compose (TLS: deploy/kustomize, docs/door.md#tls).
        assert "DOOR_CERTIFICATE" not in env, door
        # The door's files and sockets on its own tmpfs; the root read-only.
        assert service["read_only"] is True, door
        assert env["DOOR_DIR"] in service["tmpfs"], door
        assert service["restart"] == "unless-stopped", door
        # Healthy while it answers /door/ready (the lease holds), as the
        # kustomize readiness probe.
        check = " ".join(service["healthcheck"]["test"])
        assert "http://127.0.0.1:8080/door/ready" in check, door
    assert names == set(DOORS)
    # Two CPU replicas behind them, from the same image.
    assert services["vllm-cpu-b"]["image"] == services["vllm-cpu"]["image"]
    assert 'apt-get install -y --no-install-recommends "haproxy=${HAPROXY_VERSION}"' in (
        (REPO / "Dockerfile").read_text()
    )


def test_the_doors_hold_their_token_and_no_application_setting(services):
    """A door is reached by clients: it gets the DOOR_* variables, its role and
    its token, read-only, from the volume door-credential writes it to; no
    database URL, broker, store or secret file of the application."""
    for door in DOORS:
        service = services[door]
        env = service["environment"]
        assert set(env) == {
            "PROCESS_ROLE",
            "DOOR_DEPLOYMENT",
            "DOOR_NAME",
            "DOOR_CONTROL_PLANE",
            "DOOR_TOKEN_FILE",
            "DOOR_DIR",
            "DOOR_LISTEN",
            "DOOR_PEERS",
            "DOOR_LEASE_SECONDS",
        }, door
        assert "secrets" not in service, door
        assert _volumes(service) == ["door-credential:/etc/door-credential:ro"], door
        assert env["DOOR_TOKEN_FILE"] == "/etc/door-credential/token", door
    writer = services[CREDENTIAL]
    assert _volumes(writer) == ["door-credential:/var/lib/registry:rw"]
    command = writer["command"]
    assert command[:4] == ["python", "manage.py", "door_credential", "local-cpu"]
    # It writes the file the doors read (0600, the image's UID 10001:
    # serving/management/commands/door_credential.py), in the volume.
    assert command[4:] == ["--write", "/var/lib/registry/token"]
    # The volume's mount point is the image's VAR_DIR (an empty folder of UID
    # 10001, whose owner a new volume takes); settings' VAR_DIR moves to the tmpfs.
    assert writer["environment"]["VAR_DIR"].startswith("/tmp/")
    assert writer["tmpfs"] == ["/tmp"]
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "VAR_DIR=/var/lib/registry" in dockerfile
    assert 'chown 10001:0 "$VAR_DIR"' in dockerfile
    assert writer["environment"]["PROCESS_ROLE"] == "door-credential"
    assert set(writer["environment"]) == {
        "PROCESS_ROLE",
        "DJANGO_SECRET_KEY_FILE",
        "SERVING_DOORS",
        "VAR_DIR",
    }


# Stand-ins for the files scripts/compose-secrets.sh writes: settings parse them.
SECRET_FILE_VALUES = {
    "database_url": "postgres://registry_app:pw@postgres:5432/registry",
    "migrate_database_url": "postgres://registry:pw@postgres:5432/registry",
}


def test_each_service_starts_with_only_its_own_secret_files(services, tmp_path):
    """Settings fail fast on what a process needs: each registry service starts
    with its own files (mounted at /run/secrets/<name>, here in a folder of the
    test) and nothing else of the host."""
    files = tmp_path / "secrets"
    files.mkdir()
    cases = []
    for name in sorted(PRODUCT):
        env = {"PATH": os.environ["PATH"], "VAR_DIR": str(tmp_path / name)}
        for variable, value in services[name]["environment"].items():
            if variable == "VAR_DIR":  # a container's path: here, the test's folder
                continue
            if variable.endswith("_FILE") and str(value).startswith("/run/secrets/"):
                secret = value.rsplit("/", 1)[-1]
                assert secret in _secrets(services[name]), (name, secret)  # mounted
                (files / secret).write_text(SECRET_FILE_VALUES.get(secret, f"stand-in-{secret}"))
                value = str(files / secret)
            env[variable] = str(value)
        cases.append(env)
    started = settings_started(cases)
    assert started == [services[n]["environment"]["PROCESS_ROLE"] for n in sorted(PRODUCT)]


@pytest.fixture(scope="module")
def written() -> dict:
    """The services as written (PyYAML resolves the anchors and merge keys):
    what follows needs no docker-compose, so it runs wherever the suite does."""
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]


def _mounts(service: dict) -> set[str]:
    return {str(v).split(":")[0] for v in service.get("volumes", [])}


def test_no_shared_door_volume_only_the_token_volume_for_the_doors(written):
    """With doors that pull, no process shares a door's directory (its admin
    socket can open the door to callers with no key, and it holds the vLLM key
    map): each door keeps it in its own tmpfs. The one volume a door mounts is
    its token's, read-only; only door-credential writes it."""
    volumes = yaml.safe_load((REPO / "docker-compose.yml").read_text())["volumes"]
    assert "gateway" not in volumes
    assert "door-credential" in volumes
    mounting = {name for name, service in written.items() if "gateway" in _mounts(service)}
    assert mounting == set()
    token = {name for name, service in written.items() if "door-credential" in _mounts(service)}
    assert token == set(DOORS) | {CREDENTIAL}
    for door in DOORS:
        assert [str(v) for v in written[door]["volumes"]] == [
            "door-credential:/etc/door-credential:ro"
        ]
    # The workers write each door state to the database (and wait for the
    # doors' acknowledgements): their queues still carry the door's tasks.
    routes = settings.CELERY_TASK_ROUTES
    assert routes["serving.door_access_*"]["queue"] == "reconcile"
    assert routes["serving.run_rollout"]["queue"] == "rollouts"


def test_every_replica_exports_its_tokens_to_the_receiver_with_the_token(written):
    """Without the span exporter nothing is metered (issue 43: 7,086 requests,
    "No tokens counted"). Each replica sends its spans to the web service's
    receiver for the demo deployment, with the metering token from a secret file."""
    endpoint = "http://web:8000/otlp/local-cpu/v1/traces"
    for name in ("vllm-cpu", "vllm-cpu-b"):
        env = written[name]["environment"]
        assert env["SERVE_OTLP_TRACES_ENDPOINT"] == endpoint, name
        assert env["SERVE_OTLP_TOKEN_FILE"] == "/run/secrets/metering_token", name
    gpu = written["vllm-gpu"]
    assert f"--otlp-traces-endpoint={endpoint}" in gpu["command"]
    assert "--enable-force-include-usage" in gpu["command"]
    assert gpu["environment"]["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
    entrypoint = " ".join(gpu["entrypoint"])
    assert "OTEL_EXPORTER_OTLP_TRACES_HEADERS=" in entrypoint
    assert "$$(cat /run/secrets/metering_token)" in entrypoint
    assert "web" in written["web"]["environment"]["DJANGO_ALLOWED_HOSTS"].split(",")


def test_the_metering_token_file_is_the_one_the_receiver_checks(tmp_path):
    """compose-secrets.sh derives the token without Django: it must be the
    one observability.otlp.metering_token gives for the same secret key."""
    target = tmp_path / "secrets"
    script = REPO / "scripts" / "compose-secrets.sh"
    subprocess.run(["bash", str(script), str(target)], check=True, capture_output=True)
    secret = (target / "django_secret_key").read_text()
    assert (target / "metering_token").read_text() == metering_token("local-cpu", secret)
    assert metering_token("local-cpu", secret) != metering_token("other", secret)
