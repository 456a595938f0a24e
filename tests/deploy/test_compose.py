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

REPO = Path(__file__).resolve().parents[2]
QUEUES = {"rollouts", "reconcile", "housekeeping"}
REGISTRY = {"migrate", "web", "beat"} | {f"worker-{q}" for q in QUEUES}


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


def test_healthchecks_and_start_order(services):
    for name in ("postgres", "redis", "minio", "mlflow", "web", "vllm-cpu", "vllm-gpu"):
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


def test_two_database_roles_the_migration_owns_the_tables(services):
    migrate = services["migrate"]
    assert "db_grant_app_role registry_app" in " ".join(migrate["command"])
    assert {s if isinstance(s, str) else s["source"] for s in migrate["secrets"]} >= {
        "migrate_database_url"
    }
    for name in REGISTRY - {"migrate"}:
        secrets = {s if isinstance(s, str) else s["source"] for s in services[name]["secrets"]}
        assert "migrate_database_url" not in secrets, name
    init = [v for v in _volumes(services["postgres"]) if "docker-entrypoint-initdb.d" in v]
    assert init and (REPO / "deploy/docker/postgres-app-role.sh").exists()


def test_secrets_come_from_files_never_from_the_file_itself(services):
    text = (REPO / "docker-compose.yml").read_text()
    for name in REGISTRY:
        env = services[name]["environment"]
        assert env["DJANGO_SECRET_KEY_FILE"] == "/run/secrets/django_secret_key"
        database = "migrate_database_url" if name == "migrate" else "database_url"
        assert env["DATABASE_URL_FILE"] == f"/run/secrets/{database}"
        assert env["AWS_SECRET_ACCESS_KEY_FILE"] == "/run/secrets/s3_secret_key"
        assert "DJANGO_SECRET_KEY" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert "POSTGRES_PASSWORD:" not in text


def test_the_secrets_script_writes_each_file_once(tmp_path):
    target = tmp_path / "secrets"
    script = REPO / "scripts" / "compose-secrets.sh"
    subprocess.run(["bash", str(script), str(target)], check=True, capture_output=True)
    files = {p.name: p.read_text() for p in target.iterdir()}
    assert set(files) == {
        "django_secret_key",
        "postgres_password",
        "s3_secret_key",
        "app_db_password",
        "database_url",
        "migrate_database_url",
    }
    assert len(files["django_secret_key"]) >= 50
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


def test_the_front_door_is_the_client_url_and_the_workers_drive_it(services):
    gateway = services["gateway"]
    assert [str(p["published"]) for p in gateway["ports"]] == ["8080"]
    assert "gateway_sync local-cpu --print-command" in " ".join(gateway["command"])
    for name in ("gateway", "worker-rollouts", "worker-reconcile"):
        env = services[name]["environment"]
        assert env["SERVING_GATEWAYS"] == "local-cpu=0.0.0.0:8080"
        assert env["SERVING_GATEWAY_DIR"] == "/var/run/gateway"
        assert "gateway:/var/run/gateway:rw" in _volumes(services[name])
    # Two CPU replicas behind it, from the same image.
    assert services["vllm-cpu-b"]["image"] == services["vllm-cpu"]["image"]
    assert "apt-get install -y --no-install-recommends haproxy" in (REPO / "Dockerfile").read_text()
