"""The door-state endpoint answers plain HTTP even where the site redirects
to https://: door agents call the web Service inside the cluster
(deploy/kustomize/base/gateway.yaml, DOOR_CONTROL_PLANE http://lora-registry-web:8000),
where a redirect would send them to no listener at all."""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def test_the_door_state_endpoint_is_not_redirected_to_https(settings):
    settings.SECURE_SSL_REDIRECT = True
    settings.SERVING_DOORS = {"production": "pull"}
    client = Client()
    # No token: the endpoint's own 404, not the middleware's 301.
    assert client.get("/doors/production/state", {"door": "d1"}).status_code == 404
    assert client.post("/doors/production/ack", {}).status_code == 404
    # vLLM's span exporter posts to the OTLP receiver the same way: its own
    # answer (no token: 401), never a redirect that loses the tokens.
    assert client.post(
        "/otlp/production/v1/traces", b"", content_type="application/x-protobuf"
    ).status_code in (401, 404)
    # Everything else still goes to https://.
    redirected = client.get("/api/v1/deployments/")
    assert redirected.status_code == 301
    assert redirected["Location"].startswith("https://")
