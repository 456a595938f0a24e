"""A restore proves itself (issue 30, item 7): after `audit_verify --expect-head
<head> --restored`, a deployment whose rows differ from the audit chain up to
that head gets no call and no vLLM key until a platform admin acknowledges the
difference; an untouched restore serves as before.

The first test edits a real `pg_dump` and restores it into a new database, run
by `manage.py` processes as docs/operators/retention.md says; the others edit
the rows in place, which is what a restored edited dump amounts to."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import StringIO

import psycopg
import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection

from core.audit import audit_record
from core.errors import NotAuthorized
from core.models import AuditEvent
from serving.attestation import RestoreQuarantined, differences
from serving.door.selectors import door_access, routing_table_for
from serving.models import Deployment, ServedAdapter
from serving.reconcile.tick import reconcile_deployment
from serving.rollouts.engine import rollout_execute
from serving.services.promotions import promotion_create
from serving.services.restore import deployment_restore_acknowledge
from tests.conftest import actor, client_for, requires_postgres
from tests.serving.conftest import make_deployment
from tests.support.processes import REPO_ROOT
from tests.support.vllm_standin import serve_standin

VLLM_KEY = "sk-vllm-restore-0123456789"


class Listener:
    """Whatever an edited dump points a replica at: records every request's
    path and Authorization header, answers 200 to each."""

    def __init__(self):
        self.seen: list[tuple[str, str]] = []
        seen = self.seen

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                seen.append((self.path, self.headers.get("Authorization", "")))
                body = b'{"data": [], "version": "0.32.0"}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def listener():
    server = Listener()
    yield server
    server.close()


@pytest.fixture
def keyed_replicas():
    replicas = [serve_standin(api_key=VLLM_KEY), serve_standin(api_key=VLLM_KEY)]
    yield replicas
    for replica in replicas:
        replica.close()


@pytest.fixture
def keyed_deployment(root, keyed_replicas, tmp_path):
    return make_deployment(
        root,
        [r.base_url for r in keyed_replicas],
        tmp_path / "volume",
        vllm_api_key=VLLM_KEY,
    )


def _serve(lena, deployment, version) -> None:
    promotion = promotion_create(actor=actor(lena), deployment=deployment, version=version)
    assert rollout_execute(promotion.rollouts.get().pk, "w") == "succeeded"


def _head() -> str:
    out = StringIO()
    call_command("audit_verify", stdout=out)
    return re.search(r"head (\w+)", out.getvalue())[1]


def _restored(head: str) -> str:
    out = StringIO()
    call_command("audit_verify", expect_head=head, restored=True, stdout=out)
    return out.getvalue()


def _database_url(name: str) -> str:
    conf = connection.settings_dict
    password = f":{conf['PASSWORD']}" if conf.get("PASSWORD") else ""
    return (
        f"postgres://{conf.get('USER') or 'postgres'}{password}@"
        f"{conf.get('HOST') or '127.0.0.1'}:{conf.get('PORT') or 5432}/{name}"
    )


def _manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def _edit_rows(dump: str, tables: set[str], old: str, listener: Listener) -> str:
    """The dump with `old` replaced in the rows of `tables` only (the audit log's
    rows edited too would break the chain, which audit_verify finds already)."""
    lines, table = [], None
    for line in dump.splitlines(keepends=True):
        if line.startswith("COPY public."):
            table = line.split()[1].removeprefix("public.")
        elif line.startswith("\\."):
            table = None
        elif table in tables:
            line = line.replace(old, listener.base_url)
        lines.append(line)
    edited = "".join(lines)
    assert edited != dump
    return edited


@requires_postgres()
@pytest.mark.django_db(transaction=True)
def test_a_dump_edited_to_point_a_replica_elsewhere_sends_it_nothing_after_restore(
    lena, keyed_deployment, keyed_replicas, approved_v1, listener, tmp_path
):
    _serve(lena, keyed_deployment, approved_v1)
    head = _head()
    dump = subprocess.run(
        ["pg_dump", "--format=plain", "--no-owner", "--no-privileges",
         _database_url(connection.settings_dict["NAME"])],
        check=True, capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip
    # The edit: the second replica is now whatever listens at the attacker's address.
    moved = keyed_replicas[1].base_url
    assert moved in dump
    edited = tmp_path / "edited.sql"
    edited.write_text(_edit_rows(dump, {"serving_deployment", "serving_replica"}, moved, listener))

    restored = f"restore_{uuid.uuid4().hex[:8]}"
    admin_url = _database_url("postgres")
    subprocess.run(["psql", admin_url, "-c", f"CREATE DATABASE {restored}"],
                   check=True, capture_output=True, timeout=60)  # fmt: skip
    try:
        subprocess.run(
            ["psql", "-v", "ON_ERROR_STOP=1", "-q", "-f", str(edited), _database_url(restored)],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CELERY_"))},
            "DATABASE_URL": _database_url(restored),
            "VAR_DIR": str(tmp_path / "restored-var"),
            "DJANGO_SECRET_KEY": settings.SECRET_KEY,  # the vLLM key decrypts again
            "DJANGO_DEBUG": "true",
        }
        for replica in keyed_replicas:
            replica.restart()  # fresh replicas, as after the disaster
            replica.requests.clear()

        verified = _manage(env, "audit_verify", "--expect-head", head, "--restored")
        assert verified.returncode == 0, verified.stderr[-2000:]
        assert f"Replica URL {listener.base_url} is not named by the audit chain" in (
            verified.stdout
        ), verified.stdout

        reconciled = _manage(env, "reconcile", keyed_deployment.name)
        assert reconciled.returncode == 0, reconciled.stderr[-3000:]
        assert f"{keyed_deployment.name}: quarantined, nothing sent" in reconciled.stdout
        assert listener.base_url in reconciled.stdout

        # What the deployment's page and API show (restore_hold).
        with psycopg.connect(_database_url(restored)) as db:
            (shown,) = db.execute(
                "SELECT restore_differences FROM serving_deployment WHERE name = %s",
                [keyed_deployment.name],
            ).fetchone()
        assert any(listener.base_url in line for line in shown), shown
    finally:
        drop = f"DROP DATABASE IF EXISTS {restored} WITH (FORCE)"
        subprocess.run(["psql", admin_url, "-c", drop], capture_output=True, timeout=60)

    # Nothing reached the address the dump named, key or not; nor the other replica.
    assert listener.seen == []
    assert keyed_replicas[0].requests == []


def _tamper_served_version(deployment, version) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE serving_servedadapter SET version_id = %s WHERE deployment_id = %s",
            [version.pk, deployment.pk],
        )


def _tamper_digest(deployment, version) -> None:
    # Other bytes under the served version: the files' sha256 (and its manifest
    # digest) changed to match them, as an edited dump would.
    files = [{**f, "sha256": "f" * 64} for f in version.files]
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE registry_adapterversion SET files = %s, manifest_sha256 = %s WHERE id = %s",
            [__import__("json").dumps(files), "e" * 64, version.pk],
        )


@pytest.mark.parametrize(
    "tamper, shown",
    [
        (_tamper_served_version, "is served as version 2; the audit chain says version 1"),
        (_tamper_digest, "its files digest to"),
    ],
    ids=["served-version", "digest"],
)
@pytest.mark.django_db
def test_a_dump_whose_served_version_or_digest_changed_is_refused_until_acknowledged(
    root, lena, keyed_deployment, keyed_replicas, approved_v1, approved_v2, tamper, shown
):
    _serve(lena, keyed_deployment, approved_v1)
    head = _head()
    served_version = approved_v2 if tamper is _tamper_served_version else approved_v1
    tamper(keyed_deployment, served_version)
    # A forged event appended after the shipped head vouches for nothing.
    audit_record(
        actor=None,
        action="rollout.succeeded",
        obj=keyed_deployment,
        department=None,
        details={
            "served": {
                "deployment_id": keyed_deployment.pk,
                "adapter_id": served_version.adapter_id,
                "version_id": served_version.pk,
                "version": served_version.number,
                "digest": "e" * 64,
                "served_path": ServedAdapter.objects.get().served_path,
            }
        },
    )
    for replica in keyed_replicas:
        replica.restart()
        replica.requests.clear()

    assert shown in _restored(head)
    deployment = Deployment.objects.get(pk=keyed_deployment.pk)
    assert deployment.restore_basis == AuditEvent.objects.get(hash=head).pk
    assert any(shown in line for line in deployment.restore_differences)

    report = reconcile_deployment(deployment.pk, "beat")
    assert report.skipped and shown in report.quarantined
    # The deployment says why, to platform admins: its page and the API.
    page = client_for(root).get(f"/deployments/{deployment.name}/").content.decode()
    assert "Quarantined after a restore" in page and shown in page
    api = client_for(root).get(f"/api/v1/deployments/{deployment.name}/").json()
    assert shown in api["restore_hold"]
    with pytest.raises(RestoreQuarantined):
        promotion_create(actor=actor(lena), deployment=deployment, version=approved_v2)
    assert routing_table_for(deployment).endpoints == ()
    assert door_access(deployment).upstream_key == ""
    assert all(replica.requests == [] for replica in keyed_replicas)

    with pytest.raises(NotAuthorized):
        deployment_restore_acknowledge(actor=actor(lena), deployment=deployment)
    deployment_restore_acknowledge(actor=actor(root), deployment=deployment, comment="INC-7")
    event = AuditEvent.objects.filter(action="deployment.restore_acknowledged").get()
    assert event.actor == root and event.comment == "INC-7"
    assert any(shown in line for line in event.details["differences"])

    # Served again as the rows say (edited files still fail staging's sha256 check).
    assert not reconcile_deployment(deployment.pk, "beat").skipped
    assert all(("GET", "/v1/models") in {(m, p) for m, p, _ in r.requests} for r in keyed_replicas)
    # The acknowledgement is the chain's record now: a later restore finds it named.
    assert differences(deployment, AuditEvent.objects.order_by("-pk").first().pk) == []


@pytest.mark.django_db
def test_an_untouched_restore_serves_as_before(
    root, lena, keyed_deployment, keyed_replicas, approved_v1
):
    _serve(lena, keyed_deployment, approved_v1)
    path = ServedAdapter.objects.get().served_path
    head = _head()
    for replica in keyed_replicas:
        replica.restart()

    assert f"{keyed_deployment.name}: matches the audit chain; serving." in _restored(head)
    deployment = Deployment.objects.get(pk=keyed_deployment.pk)
    assert deployment.restore_basis is None
    assert AuditEvent.objects.filter(action="deployment.restore_attested").count() == 1

    report = reconcile_deployment(deployment.pk, "beat")
    assert not report.skipped and report.replicas_up == 2
    assert (
        client_for(root).get(f"/api/v1/deployments/{deployment.name}/").json()["restore_hold"]
        is None
    )
    for replica in keyed_replicas:
        assert replica.adapters == {"legal-contracts": path}
    assert door_access(deployment).upstream_key == VLLM_KEY


@pytest.mark.django_db
def test_a_deployment_the_chain_never_named_is_quarantined(root, tmp_path, listener):
    # Rows a dump adds (or an installation from before replica URLs were chained).
    deployment = Deployment.objects.create(
        name="planted",
        base_model_name="tiny-llama",
        replica_urls=[listener.base_url],
        volume_write_path=str(tmp_path),
        volume_serve_path=str(tmp_path),
        vllm_api_key=VLLM_KEY,
    )
    make_deployment(root, [], tmp_path / "v", name="named", replica_dns_name="vllm.internal")
    head = _head()
    out = _restored(head)
    assert "planted is quarantined after a restore" in out
    assert "names none of this deployment's replicas" in out
    assert "named: matches the audit chain" in out
    assert reconcile_deployment(deployment.pk, "beat").quarantined
    assert listener.seen == []


def test_restored_needs_the_shipped_head():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="--restored needs --expect-head"):
        call_command("audit_verify", restored=True, stdout=StringIO())
