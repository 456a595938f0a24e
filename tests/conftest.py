"""The fixed cast every test uses, and the real servers the suite starts.

lena   member of Legal           alex   approver of Legal
paula  another approver of Legal fred   member of Finance (an outsider to Legal)
root   platform admin (staff)    a Legal pipeline token with every ability
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from rest_framework.test import APIClient

from core.actors import Actor
from core.models import Ability, Department, Membership, Role
from core.services.tokens import token_create
from registry.artifact_store import get_artifact_store
from tests.support.adapters import AdapterSpec
from tests.support.pages import signed_in

PASSWORD = "correct-horse-battery"


def pytest_configure(config):
    from django.conf import settings

    # The production hasher is slow on purpose; tests create many users.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    _let_flush_truncate_the_audit_table()


def _let_flush_truncate_the_audit_table():
    """Transactional tests end with a flush (TRUNCATE of every table), which the
    audit table's trigger refuses on PostgreSQL. The test database's owner may
    switch the trigger off for the flush; the application never does."""
    from django.db import connections
    from django.test import testcases

    original = testcases.TransactionTestCase._fixture_teardown

    def toggle(self, state: str):
        for alias in self._databases_names(include_mirrors=False):
            if connections[alias].vendor == "postgresql":
                with connections[alias].cursor() as cursor:
                    cursor.execute(
                        f"ALTER TABLE registry_auditevent {state} TRIGGER "
                        "registry_auditevent_no_truncate"
                    )

    def teardown(self):
        toggle(self, "DISABLE")
        try:
            original(self)
        finally:
            toggle(self, "ENABLE")

    testcases.TransactionTestCase._fixture_teardown = teardown


@pytest.fixture(autouse=True)
def celery_not_left_eager():
    """pytest-django runs transactional tests (browser, vLLM tiers) last; they need
    tasks to go through the real broker, so no test may leave eager mode on."""
    from config.celery import app

    before = app.conf.task_always_eager
    yield
    assert app.conf.task_always_eager == before, "this test left Celery in eager mode"


@pytest.fixture(autouse=True)
def isolated_storage(settings, tmp_path):
    """Each test gets its own artifact store and staging folder."""
    settings.ARTIFACT_STORE_URL = (tmp_path / "artifacts").as_uri()
    settings.INGEST_STAGING_DIR = tmp_path / "ingest"
    get_artifact_store.cache_clear()
    yield
    get_artifact_store.cache_clear()


@pytest.fixture(scope="session")
def s3_endpoint():
    from tests.support.s3_server import running_s3_server

    with running_s3_server() as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def vllm_pool(tmp_path_factory):
    """The session's shared real vLLM servers (tests/support/vllm_pool.py):
    `vllm_pool.servers(2)` hands out two, up and without runtime adapters."""
    from tests.support.vllm_pool import VLLMPool
    from tests.support.vllm_servers import ensure_tiny_model, ensure_vllm_installed

    ensure_vllm_installed()
    pool = VLLMPool(ensure_tiny_model(), tmp_path_factory.mktemp("vllm-pool"))
    yield pool
    pool.stop_all()


@pytest.fixture
def s3_store(settings, s3_endpoint, request):
    """Switches this test's artifact store to a fresh bucket on the real S3 server."""
    from tests.support.s3_server import make_bucket

    bucket = f"artifacts-{abs(hash(request.node.nodeid)) % 10**10}"
    make_bucket(s3_endpoint, bucket)
    settings.ARTIFACT_STORE_URL = f"s3://{bucket}/registry"
    settings.ARTIFACT_S3 = {
        **settings.ARTIFACT_S3,
        "endpoint_url": s3_endpoint,
        "access_key": "testing",
        "secret_key": "testing",
        "addressing_style": "path",
        "region": "us-east-1",
    }
    get_artifact_store.cache_clear()
    return get_artifact_store()


def _user(username, **extra):
    return get_user_model().objects.create_user(
        username=username, password=PASSWORD, email=f"{username}@example.com", **extra
    )


@pytest.fixture
def legal(db):
    return Department.objects.create(slug="legal", name="Legal")


@pytest.fixture
def finance(db):
    return Department.objects.create(slug="finance", name="Finance")


@pytest.fixture
def lena(legal):
    user = _user("lena")
    Membership.objects.create(user=user, department=legal, role=Role.MEMBER)
    return user


@pytest.fixture
def alex(legal):
    user = _user("alex")
    Membership.objects.create(user=user, department=legal, role=Role.APPROVER)
    return user


@pytest.fixture
def paula(legal):
    user = _user("paula")
    Membership.objects.create(user=user, department=legal, role=Role.APPROVER)
    return user


@pytest.fixture
def fred(finance):
    user = _user("fred")
    Membership.objects.create(user=user, department=finance, role=Role.MEMBER)
    return user


@pytest.fixture
def root(db):
    return _user("root", is_staff=True, is_superuser=True)


def actor(user, token=None) -> Actor:
    return Actor(user=user, token=token, request_id="test", client_address="127.0.0.1")


@pytest.fixture
def legal_token(legal, lena):
    token, secret = token_create(
        actor=actor(lena), department=legal, name="ci", abilities=list(Ability.values)
    )
    token.secret = secret
    return token


def client_for(who, legal_token=None) -> APIClient:
    client = APIClient()
    if who == "token":
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {legal_token.secret}")
    elif who is not None:
        client.force_login(who)
    return client


@pytest.fixture
def as_lena(lena):
    return client_for(lena)


@pytest.fixture
def as_alex(alex):
    return client_for(alex)


@pytest.fixture
def as_paula(paula):
    return client_for(paula)


@pytest.fixture
def as_fred(fred):
    return client_for(fred)


@pytest.fixture
def as_root(root):
    return client_for(root)


@pytest.fixture
def as_token(legal_token):
    return client_for("token", legal_token)


@pytest.fixture
def anonymous():
    return APIClient()


@pytest.fixture
def adapter_spec():
    return AdapterSpec()


def requires_postgres():
    return pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="needs PostgreSQL: SQLite has no row locks (SELECT ... FOR UPDATE)",
    )


@pytest.fixture
def web_lena(lena):
    return signed_in(lena)


@pytest.fixture
def web_alex(alex):
    return signed_in(alex)


@pytest.fixture
def web_paula(paula):
    return signed_in(paula)


@pytest.fixture
def web_fred(fred):
    return signed_in(fred)


@pytest.fixture
def web_root(root):
    return signed_in(root)
