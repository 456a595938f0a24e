"""Backup and restore, as docs/operators/retention.md says to do them: `pg_dump` of
the database, a copy of the artifact store, the audit head. The backup is restored
into a fresh instance (its own database, store folder and processes) after the
adapter volume is gone and both vLLM replicas restarted empty; the restored chain
verifies against the head kept, the deployment matches it (so it is not held), and
the reconcile alone puts every served adapter back on the fresh replicas."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection

from tests.conftest import requires_postgres
from tests.serving.vllm.conftest import adapters_on, chat_through_openai
from tests.support.adapters import AdapterSpec
from tests.support.processes import REPO_ROOT

pytestmark = [pytest.mark.vllm, pytest.mark.django_db(transaction=True)]

SERVED = {"contracts": "legal-contracts", "invoices": "legal-invoices"}


def _database_url(name: str) -> str:
    conf = connection.settings_dict
    user = conf.get("USER") or "postgres"
    password = f":{conf['PASSWORD']}" if conf.get("PASSWORD") else ""
    host = conf.get("HOST") or "127.0.0.1"
    port = conf.get("PORT") or 5432
    return f"postgres://{user}{password}@{host}:{port}/{name}"


def _audit_head() -> str:
    from io import StringIO

    out = StringIO()
    call_command("audit_verify", stdout=out)
    return re.search(r"head (\w+)", out.getvalue())[1]


def _manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@requires_postgres()
def test_a_backup_restored_into_a_fresh_instance_verifies_and_serves_again(
    platform, vllm_servers, celery_worker, tmp_path
):
    urls = [server.base_url for server in vllm_servers]
    platform.create_deployment("restore-cpu", urls)
    for seed, (name, served_name) in enumerate(SERVED.items(), start=20):
        version = platform.approved_version(name, served_name, AdapterSpec(seed=seed))
        assert platform.promote_and_wait("restore-cpu", version["id"])["status"] == "succeeded"
    for server in vllm_servers:
        assert set(SERVED.values()) <= set(adapters_on(server))

    # The backup: the database, the store, the audit head (shipped elsewhere).
    head = _audit_head()
    dump = tmp_path / "registry.dump"
    subprocess.run(
        ["pg_dump", "--format=custom", "--no-owner", f"--file={dump}",
         _database_url(connection.settings_dict["NAME"])],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    store = Path(settings.ARTIFACT_STORE_URL.removeprefix("file://"))
    store_backup = tmp_path / "store-backup"
    shutil.copytree(store, store_backup)

    # The disaster: the adapter volume is lost, both replicas come back empty.
    shutil.rmtree(platform.volume)
    for server in vllm_servers:
        server.restart(timeout=300)
        assert not set(SERVED.values()) & set(adapters_on(server))

    # A fresh instance from the backup.
    restored = f"restore_{uuid.uuid4().hex[:8]}"
    admin_url = _database_url("postgres")
    subprocess.run(["psql", admin_url, "-c", f"CREATE DATABASE {restored}"],
                   check=True, capture_output=True, timeout=60)  # fmt: skip
    try:
        subprocess.run(
            ["pg_restore", "--no-owner", f"--dbname={_database_url(restored)}", str(dump)],
            check=True, capture_output=True, timeout=300,
        )  # fmt: skip
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CELERY_"))},
            "DATABASE_URL": _database_url(restored),
            "ARTIFACT_STORE_URL": store_backup.as_uri(),
            "VAR_DIR": str(tmp_path / "restored-var"),
            # The same key: the deployment's encrypted fields are readable again.
            "DJANGO_SECRET_KEY": settings.SECRET_KEY,
            "DJANGO_DEBUG": "true",
        }
        migrated = _manage(env, "migrate", "--noinput")
        assert migrated.returncode == 0, migrated.stderr[-2000:]

        verified = _manage(env, "audit_verify", "--expect-head", head, "--restored")
        assert verified.returncode == 0, verified.stderr[-2000:]
        assert f"head {head}" in verified.stdout or "Audit chain intact" in verified.stdout
        # An untouched dump: the chain names its replicas and versions, so it serves.
        assert "restore-cpu: matches the audit chain; serving." in verified.stdout
        forged = _manage(env, "audit_verify", "--expect-head", "0" * 64)
        assert forged.returncode != 0 and "not in it" in forged.stderr

        reconciled = _manage(env, "reconcile", "restore-cpu")
        assert reconciled.returncode == 0, reconciled.stderr[-3000:]
        assert "2 replicas up" in reconciled.stdout, reconciled.stdout
    finally:
        drop = f"DROP DATABASE IF EXISTS {restored} WITH (FORCE)"
        subprocess.run(["psql", admin_url, "-c", drop], capture_output=True, timeout=60)

    # Every served adapter is back on both fresh replicas, restaged from the store.
    for server in vllm_servers:
        listed = adapters_on(server)
        assert set(SERVED.values()) <= set(listed), (server, listed)
        for served_name in SERVED.values():
            assert Path(listed[served_name]).is_dir()
            chat_through_openai(server.base_url, served_name)
