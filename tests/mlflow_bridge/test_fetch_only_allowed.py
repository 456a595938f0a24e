"""Issue 21, item 1: the registry fetches a run's artifact from nowhere but the
allowed places, and never more bytes than the ingest limits.

The confirmed attack: an experiment whose artifact location is
`mlflow-artifacts://<any host>:<port>/x` (MLflow 3 accepts it with
MLFLOW_ALLOWED_HOST_ADDRESSED_ARTIFACT_SCHEMES set; older servers do not check),
and a registration from its run made the registry call that host with its MLflow
token. Here: a real MLflow server started with that setting, and a listener on
another port that records what reaches it.
"""

from __future__ import annotations

import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from registry.models import AdapterVersion
from tests.mlflow_bridge.conftest import TrainingRun, allow_experiment, log_run
from tests.support.mlflow_server import MlflowServer, server_installed

pytestmark = pytest.mark.mlflow

TOKEN = "tracking-token-never-elsewhere"


class Listener:
    def __init__(self):
        self.requests: list[tuple[str, str]] = []
        listener = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                listener.requests.append((self.path, self.headers.get("Authorization", "")))
                body = b'{"files": [{"path": "adapter/x.bin", "is_dir": false, "file_size": 1}]}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def permissive_mlflow(request, tmp_path_factory):
    if not server_installed():
        request.getfixturevalue("mlflow_server")  # skips, or fails under REQUIRE_MLFLOW
    server = MlflowServer.from_repo(
        tmp_path_factory.mktemp("permissive-mlflow"),
        env={"MLFLOW_ALLOWED_HOST_ADDRESSED_ARTIFACT_SCHEMES": "mlflow-artifacts,http,https"},
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture
def listener():
    listening = Listener()
    yield listening
    listening.close()


def test_a_run_proxied_by_another_host_is_refused_before_anything_reaches_it(
    permissive_mlflow, listener, settings, adapter, as_token
):
    from mlflow import MlflowClient

    settings.MLFLOW_TRACKING_URI = permissive_mlflow.url
    settings.MLFLOW_TRACKING_TOKEN = TOKEN
    settings.MLFLOW_HTTP_MAX_RETRIES = 0
    tracking = MlflowClient(tracking_uri=permissive_mlflow.url)
    experiment = tracking.create_experiment(
        f"elsewhere-{uuid.uuid4().hex[:8]}",
        artifact_location=f"mlflow-artifacts://127.0.0.1:{listener.port}/x",
    )
    allow_experiment(experiment)
    run_id = tracking.create_run(experiment).info.run_id
    tracking.set_terminated(run_id, "FINISHED")
    assert tracking.get_run(run_id).info.artifact_uri.startswith(
        f"mlflow-artifacts://127.0.0.1:{listener.port}/"
    )

    response = as_token.post(
        f"/api/v1/adapters/{adapter.pk}/versions/from-mlflow-run/",
        {"run_id": run_id, "artifact_path": "adapter"},
        format="json",
    )

    assert response.status_code == 403, response.json()
    error = response.json()["error"]
    assert error["code"] == "mlflow_artifact_location_not_allowed"
    assert "tracking server" in error["message"]
    assert listener.requests == []  # nothing, and so no token, reached the other host
    assert not AdapterVersion.objects.exists()


def test_bytes_past_the_limit_are_cut_off_even_when_the_listing_says_less(
    mlflow_on, tracking, adapter, as_token, tmp_path, settings, monkeypatch
):
    """The tracking server's listing decides the pre-check; the download itself
    counts what arrives (a server that lies about sizes, or files that grew)."""
    from mlflow_bridge import lineage
    from mlflow_bridge.runs import ArtifactEntry

    run_id = log_run(tracking, tmp_path, TrainingRun(files={"weights.bin": b"x" * 300_000}))
    settings.INGEST_MAX_BYTES = 100_000
    lying = [ArtifactEntry("adapter/weights.bin", False, 10)]
    monkeypatch.setattr(lineage, "walk_artifacts", lambda *a, **k: lying)

    response = as_token.post(
        f"/api/v1/adapters/{adapter.pk}/versions/from-mlflow-run/",
        {"run_id": run_id, "artifact_path": "adapter"},
        format="json",
    )

    assert response.status_code == 413, response.json()
    error = response.json()["error"]
    assert error["code"] == "artifact_too_large" and "INGEST_MAX_BYTES" in error["message"]
    assert not AdapterVersion.objects.exists()
    assert list(settings.INGEST_STAGING_DIR.iterdir()) == []


def test_the_pre_check_names_the_rule(mlflow_on, tracking, adapter, as_token, tmp_path, settings):
    run_id = log_run(tracking, tmp_path, TrainingRun(files={"weights.bin": b"x" * 300_000}))
    settings.INGEST_MAX_BYTES = 100_000
    response = as_token.post(
        f"/api/v1/adapters/{adapter.pk}/versions/from-mlflow-run/",
        {"run_id": run_id, "artifact_path": "adapter"},
        format="json",
    )
    assert response.status_code == 413
    assert "INGEST_MAX_BYTES" in response.json()["error"]["message"]
