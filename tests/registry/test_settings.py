"""Bad configuration stops start-up with a message naming the variable;
`*_FILE` secrets are read from files. Each case starts a fresh interpreter,
because settings are read once per process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Variables the test run or the machine may set that would change the outcome.
CLEARED = {
    "PROCESS_ROLE",
    "FIELD_ENCRYPTION_KEY",
    "OIDC_ISSUER",
    "OIDC_RP_CLIENT_ID",
    "OIDC_RP_CLIENT_SECRET",
    "DATABASE_URL",
    "DATABASE_URL_FILE",
    "CELERY_BROKER_URL",
    "ARTIFACT_STORE_URL",
    "DJANGO_DEBUG",
    "DJANGO_SECRET_KEY",
    "DJANGO_SECRET_KEY_FILE",
    "INGEST_MAX_BYTES",
    "INGEST_MAX_ENTRIES",
}


def start(tmp_path, print_expr="'started'", **env_changes):
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        DJANGO_SECRET_KEY="test-key",
        VAR_DIR=str(tmp_path / "var"),
    )
    for key, value in env_changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    code = (
        "import django; django.setup(); from django.conf import settings; print(" + print_expr + ")"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_defaults_start(tmp_path):
    result = start(tmp_path, "settings.DATABASES['default']['ENGINE']")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "django.db.backends.sqlite3"


@pytest.mark.parametrize(
    ("variable", "env", "hint"),
    [
        ("DATABASE_URL", {"DATABASE_URL": "mysql://u:p@db/registry"}, "mysql"),
        ("INGEST_MAX_BYTES", {"INGEST_MAX_BYTES": "abc"}, "integer"),
        ("INGEST_MAX_BYTES", {"INGEST_MAX_BYTES": "10"}, "at least"),
        ("INGEST_MAX_ENTRIES", {"INGEST_MAX_ENTRIES": "1"}, "at least"),
        ("CELERY_BROKER_URL", {"CELERY_BROKER_URL": "amqp://guest@rabbit//"}, "amqp"),
        ("ARTIFACT_STORE_URL", {"ARTIFACT_STORE_URL": "ftp://host/dir"}, "ftp"),
        ("DJANGO_DEBUG", {"DJANGO_DEBUG": "maybe"}, "true or false"),
        ("SERVING_DTYPE", {"SERVING_DTYPE": "int8"}, "int8"),
        ("COST_CURRENCY", {"COST_CURRENCY": "dollars"}, "ISO 4217"),
        (
            "SERVING_GATEWAY_ADMIN",
            {"SERVING_GATEWAY_ADMIN": "prod=gateway:9999"},
            "UNIX socket",
        ),
        (
            "SERVING_DOOR_MAX_BODY_BYTES",
            {"SERVING_DOOR_MAX_BODY_BYTES": "100"},
            "at least",
        ),
        ("AWS_S3_ADDRESSING_STYLE", {"AWS_S3_ADDRESSING_STYLE": "sideways"}, "sideways"),
        (
            "DJANGO_SECRET_KEY",
            {"DJANGO_SECRET_KEY": None, "DJANGO_DEBUG": "false"},
            "DJANGO_DEBUG",
        ),
        (
            "DJANGO_SECRET_KEY_FILE",
            {"DJANGO_SECRET_KEY": None, "DJANGO_SECRET_KEY_FILE": "/run/secrets/missing"},
            "/run/secrets/missing",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_bad_value_stops_start_up_naming_the_variable(tmp_path, variable, env, hint):
    result = start(tmp_path, **env)

    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("django.core.exceptions.ImproperlyConfigured: "), last_line
    assert variable in last_line
    assert hint in last_line
    assert "started" not in result.stdout


def test_secret_key_may_come_from_a_file(tmp_path):
    secret_file = tmp_path / "secret_key"
    secret_file.write_text("from-a-file\n")

    result = start(
        tmp_path,
        "settings.SECRET_KEY",
        DJANGO_SECRET_KEY=None,
        DJANGO_SECRET_KEY_FILE=str(secret_file),
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "from-a-file"


def test_database_url_and_s3_keys_may_come_from_files(tmp_path):
    (tmp_path / "db").write_text("postgres://reg:pw@db.internal:5432/registry\n")
    (tmp_path / "s3").write_text("s3-secret\n")

    result = start(
        tmp_path,
        "settings.DATABASES['default']['HOST'], settings.ARTIFACT_S3['secret_key']",
        DATABASE_URL_FILE=str(tmp_path / "db"),
        AWS_SECRET_ACCESS_KEY_FILE=str(tmp_path / "s3"),
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["db.internal", "s3-secret"]


ROLLOUTS_WORKER = {
    "PROCESS_ROLE": "worker-rollouts",
    "DJANGO_SECRET_KEY": None,
    "FIELD_ENCRYPTION_KEY": "field-key",
    "DATABASE_URL": "postgres://registry_app:pw@db:5432/registry",
    "CELERY_BROKER_URL": "redis://redis:6379/0",
    # Single sign-on on: the worker signs nobody in, so needs no client secret.
    "OIDC_ISSUER": "https://idp.example.com/realm",
    "OIDC_RP_CLIENT_ID": "registry",
}


def test_a_process_starts_without_the_secrets_its_role_does_not_read(tmp_path):
    """A rollouts worker gets no DJANGO_SECRET_KEY and no OIDC client secret
    (config/roles.py); Django then refuses any use of the empty SECRET_KEY."""
    result = start(tmp_path, "settings.PROCESS_ROLE, settings.SSO_ENABLED", **ROLLOUTS_WORKER)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["worker-rollouts", "True"]
    refused = start(tmp_path, "settings.SECRET_KEY", **ROLLOUTS_WORKER)
    assert "The SECRET_KEY setting must not be empty" in refused.stderr


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"FIELD_ENCRYPTION_KEY": None}, "FIELD_ENCRYPTION_KEY"),
        ({"PROCESS_ROLE": "web", "DJANGO_SECRET_KEY": None}, "DJANGO_SECRET_KEY"),
        (
            {"PROCESS_ROLE": "web", "DJANGO_SECRET_KEY": "k", "METRICS_TOKEN": "t"},
            "OIDC_RP_CLIENT_SECRET",
        ),
        ({"PROCESS_ROLE": "worker-everything"}, "PROCESS_ROLE"),
    ],
    ids=["field-key", "web-secret-key", "web-sso-secret", "unknown-role"],
)
def test_a_process_stops_without_a_secret_its_role_needs(tmp_path, changes, named):
    result = start(tmp_path, **{**ROLLOUTS_WORKER, **changes})
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("django.core.exceptions.ImproperlyConfigured: "), last_line
    assert named in last_line


def test_debug_without_a_secret_key_starts_with_a_development_key(tmp_path):
    result = start(tmp_path, "settings.DEBUG", DJANGO_SECRET_KEY=None, DJANGO_DEBUG="true")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"


def test_production_settings_pass_check_deploy(tmp_path):
    """DJANGO_DEBUG=false with a real secret: Django's deployment checklist has
    nothing to say (secure cookies, HSTS, SSL redirect, ...)."""
    import secrets

    env = {k: v for k, v in os.environ.items() if k not in CLEARED and not k.startswith("DJANGO_")}
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        DJANGO_DEBUG="false",
        DJANGO_SECRET_KEY=secrets.token_urlsafe(64),
        DJANGO_ALLOWED_HOSTS="registry.example.com",
        DJANGO_SECURE_PROXY_SSL_HEADER="HTTP_X_FORWARDED_PROTO=https",
        VAR_DIR=str(tmp_path / "var"),
    )
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout, result.stdout + result.stderr


def test_a_malformed_proxy_header_stops_start_up(tmp_path):
    result = start(
        tmp_path, "settings.SECURE_PROXY_SSL_HEADER", DJANGO_SECURE_PROXY_SSL_HEADER="https"
    )
    assert result.returncode != 0
    assert "DJANGO_SECURE_PROXY_SSL_HEADER" in result.stderr


def test_an_old_front_door_setting_name_still_works_and_warns_at_start_up(tmp_path):
    result = start(
        tmp_path,
        "settings.SERVING_DOORS, settings.SERVING_DOOR_HOLD_SECONDS",
        SERVING_GATEWAYS="prod=0.0.0.0:8080",
        SERVING_GATEWAY_HOLD_SECONDS="5",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "{'prod': '0.0.0.0:8080'} 5.0"
    assert "SERVING_GATEWAYS is renamed SERVING_DOORS" in result.stderr
    assert "SERVING_GATEWAY_HOLD_SECONDS is renamed SERVING_DOOR_HOLD_SECONDS" in result.stderr


def test_an_old_and_a_new_setting_name_that_disagree_stop_start_up(tmp_path):
    result = start(
        tmp_path,
        SERVING_GATEWAYS="prod=0.0.0.0:8080",
        SERVING_DOORS="prod=0.0.0.0:9090",
    )
    assert result.returncode != 0
    assert "SERVING_GATEWAYS is the old name of SERVING_DOORS" in result.stderr


def test_a_deployment_s_door_peers_are_read_by_name_and_address(tmp_path):
    result = start(
        tmp_path,
        "settings.SERVING_DOOR_PEERS, settings.SERVING_DOOR_PEER_NAME",
        SERVING_DOOR_PEERS="prod=door-0@door-0.doors:10000;door-1@10.0.0.2:10000",
        SERVING_DOOR_PEER_NAME="door-1",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        "{'prod': (('door-0', 'door-0.doors:10000'), ('door-1', '10.0.0.2:10000'))} door-1"
    )


@pytest.mark.parametrize(
    "peers",
    ["prod=door-0@door-0:10000", "prod=door-0@a:1;door-0@b:2", "prod=door 0@a:1;door-1@b:2"],
)
def test_door_peers_that_are_not_two_named_doors_stop_start_up(tmp_path, peers):
    result = start(tmp_path, SERVING_DOOR_PEERS=peers)
    assert result.returncode != 0
    assert "SERVING_DOOR_PEERS" in result.stderr


def test_a_door_certificate_that_is_not_an_absolute_path_stops_start_up(tmp_path):
    result = start(tmp_path, SERVING_DOOR_CERTIFICATES="prod=tls.pem")
    assert result.returncode != 0
    assert "SERVING_DOOR_CERTIFICATES: prod's certificate must be an absolute path" in result.stderr


def test_a_variable_no_longer_read_warns_at_start_up_and_changes_nothing(tmp_path):
    result = start(
        tmp_path,
        "settings.SERVING_ACCESS_TICK_SECONDS, settings.OIDC_TIMEOUT",
        SERVING_ACCESS_TICK_SECONDS="99",
        OIDC_TIMEOUT_SECONDS="1",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "10.0 10.0"
    assert "FixedSettingWarning" in result.stderr
    assert "SERVING_ACCESS_TICK_SECONDS is no longer read: fixed at 10" in result.stderr
    assert "OIDC_TIMEOUT_SECONDS is no longer read: fixed at 10" in result.stderr


def test_warn_fixed_names_only_the_variables_that_are_set(monkeypatch):
    from config import env as cfg

    monkeypatch.setenv("SOME_OLD_KNOB", "5")
    monkeypatch.delenv("ANOTHER_OLD_KNOB", raising=False)
    with pytest.warns(cfg.FixedSettingWarning) as caught:
        used = cfg.warn_fixed({"SOME_OLD_KNOB": "fixed at 3", "ANOTHER_OLD_KNOB": "fixed at 4"})
    assert used == ["SOME_OLD_KNOB"]
    assert [str(w.message) for w in caught] == ["SOME_OLD_KNOB is no longer read: fixed at 3"]
    assert issubclass(cfg.FixedSettingWarning, FutureWarning)
    assert os.environ["SOME_OLD_KNOB"] == "5"  # left as it was, read by nothing
