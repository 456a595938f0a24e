"""The probes (core.health): /livez asks nothing, /readyz asks the database, the
broker and the artifact store, and answers with their names and ok only: it is
anonymous, and a failing store's error names its endpoint and bucket."""

from __future__ import annotations

import time

import pytest

from registry.artifact_store import get_artifact_store
from tests.support.s3_server import free_port

pytestmark = pytest.mark.django_db


def test_ready_with_the_local_store(anonymous):
    response = anonymous.get("/readyz")

    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["checks"]["database"] == {"ok": True}
    assert body["checks"]["broker"] == {"ok": True}
    assert body["checks"]["artifact_store"] == {"ok": True}


def test_liveness_asks_no_dependency(anonymous, settings, django_assert_num_queries):
    _unreachable_s3(settings)
    with django_assert_num_queries(0):
        response = anonymous.get("/livez")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.s3
def test_ready_with_a_real_s3_store(anonymous, s3_store):
    response = anonymous.get("/readyz")
    assert response.status_code == 200, response.json()
    assert response.json()["checks"]["artifact_store"] == {"ok": True}


def _unreachable_s3(settings):
    settings.ARTIFACT_STORE_URL = "s3://secret-bucket-name/registry"
    settings.ARTIFACT_S3 = {
        **settings.ARTIFACT_S3,
        # Nothing listens here: the connection is refused at once.
        "endpoint_url": f"http://127.0.0.1:{free_port()}",
        "access_key": "probe-access-key",
        "secret_key": "probe-secret-value",
        "addressing_style": "path",
        "connect_timeout": 1,
        "read_timeout": 1,
        "max_attempts": 1,
    }
    get_artifact_store.cache_clear()


def test_an_unreachable_store_is_503_by_name_only(anonymous, settings):
    _unreachable_s3(settings)
    # The client is built first (CPU, seconds of it in the light run, niced
    # beside vLLM): what is timed is the probe of the endpoint nobody answers.
    get_artifact_store()

    started = time.monotonic()
    response = anonymous.get("/readyz")

    assert time.monotonic() - started < 10
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable"
    assert body["checks"]["database"] == {"ok": True}
    assert body["checks"]["artifact_store"] == {"ok": False}
    text = response.content.decode()
    for secret in ("127.0.0.1", "secret-bucket-name", "probe-secret-value", "probe-access-key"):
        assert secret not in text


@pytest.mark.s3
def test_a_missing_bucket_is_503_without_naming_it(anonymous, settings, s3_endpoint):
    settings.ARTIFACT_STORE_URL = "s3://no-such-bucket/registry"
    settings.ARTIFACT_S3 = {
        **settings.ARTIFACT_S3,
        "endpoint_url": s3_endpoint,
        "access_key": "testing",
        "secret_key": "testing",
        "addressing_style": "path",
    }
    get_artifact_store.cache_clear()

    response = anonymous.get("/readyz")

    assert response.status_code == 503
    assert response.json()["checks"]["artifact_store"] == {"ok": False}
    assert "no-such-bucket" not in response.content.decode()


def test_an_unreachable_broker_is_503(anonymous, settings, monkeypatch):
    from config.celery import app

    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    # Celery prefers the CELERY_BROKER_URL variable (CI sets it) to app.conf.
    monkeypatch.setenv("CELERY_BROKER_URL", nowhere)
    # setitem, not setattr: setattr on Celery's settings does not undo on the
    # embedded defaults (no CELERY_BROKER_URL), and the next tests lost their broker.
    monkeypatch.setitem(app.conf, "broker_url", nowhere)
    response = anonymous.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["broker"] == {"ok": False}


def test_an_unwritable_local_store_is_503(anonymous, settings, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    settings.ARTIFACT_STORE_URL = (blocker / "artifacts").as_uri()
    get_artifact_store.cache_clear()

    response = anonymous.get("/readyz")

    assert response.status_code == 503
    assert response.json()["checks"]["artifact_store"]["ok"] is False
    assert str(tmp_path) not in response.content.decode()


def test_the_probes_need_no_login_and_ignore_bad_tokens(anonymous):
    anonymous.credentials(HTTP_AUTHORIZATION="Bearer lrt_bogus")
    assert anonymous.get("/readyz").status_code == 200
    assert anonymous.get("/livez").status_code == 200


def test_a_store_that_fails_writes_and_cleanup_still_answers_503(as_lena, lena, legal, monkeypatch):
    """The cleanup after a failed write cannot delete from a store that is down;
    the client must still get the 503 naming the store, not a 500."""
    from registry.models import AdapterVersion
    from registry.storage import StorageError
    from tests.factories import archive_upload, make_adapter

    adapter = make_adapter(lena, legal, name="contracts")
    store = get_artifact_store()

    def down(*args, **kwargs):
        raise StorageError("connection refused")

    monkeypatch.setattr(store, "put_file", down)
    monkeypatch.setattr(store, "open_write", down)  # archives stream into the store
    monkeypatch.setattr(store, "delete_prefix", down)

    response = as_lena.post(
        f"/api/v1/adapters/{adapter.pk}/versions/",
        {"files": [archive_upload()]},
        format="multipart",
    )

    assert response.status_code == 503
    assert response.json()["error"]["code"] == "artifact_store_unavailable"
    assert AdapterVersion.objects.count() == 0
