"""Shared set-up for the scale benchmarks (bench/scale.py, bench/scale_promotions.py):
a throwaway environment (VAR_DIR, and a fresh PostgreSQL database when
--database-url is given, else SQLite), Django configured and migrated, and the
fixed cast with one approved version to clone from (tests/support/fleet.py)."""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Cast:
    admin: object
    member: object
    approver: object
    department: object
    version: object  # approved, with real files in the artifact store
    var_dir: Path


def _fresh_postgres(url: str) -> None:
    import psycopg

    base, name = url.rsplit("/", 1)
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')


def setup(prefix: str, database_url: str | None) -> Cast:
    var_dir = Path(tempfile.mkdtemp(prefix=f"bench-{prefix}-"))
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    os.environ["VAR_DIR"] = str(var_dir)
    os.environ["DJANGO_DEBUG"] = "true"
    os.environ["DJANGO_SECRET_KEY"] = "bench-only-secret-key"
    os.environ["LOG_LEVEL"] = "WARNING"
    if database_url:
        _fresh_postgres(database_url)
        os.environ["DATABASE_URL"] = database_url
    else:
        os.environ.pop("DATABASE_URL", None)
    sys.path.insert(0, str(REPO_ROOT))
    from bench.results import seed_sqlite

    seed_sqlite(var_dir)
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from core.models import Department, Membership, Role
    from tests.factories import make_adapter, make_approved_version
    from tests.support.adapters import AdapterSpec

    call_command("migrate", verbosity=0)
    users = get_user_model().objects
    admin = users.create_user("root", is_staff=True, is_superuser=True)
    member, approver = users.create_user("lena"), users.create_user("alex")
    legal = Department.objects.create(slug="legal", name="Legal")
    Membership.objects.create(user=member, department=legal, role=Role.MEMBER)
    Membership.objects.create(user=approver, department=legal, role=Role.APPROVER)
    adapter = make_adapter(member, legal, name="template", served_name="template")
    version = make_approved_version(member, approver, adapter, AdapterSpec(seed=1))
    return Cast(admin, member, approver, legal, version, var_dir)


def deployment_for(cast: Cast, name: str, urls: list[str]):
    from tests.serving.conftest import make_deployment

    volume = cast.var_dir / f"volume-{name}"
    return make_deployment(cast.admin, urls, volume, name=name)


def median(values) -> float:
    return statistics.median(values)
