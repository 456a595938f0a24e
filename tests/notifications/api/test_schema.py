"""The schema states the status each notification endpoint answers with (the
contract tier checks every operation; this fails in seconds)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db

PUBLIC_URL = "https://93.184.215.14/hooks/registry"


@pytest.fixture
def schema(anonymous):
    return anonymous.get("/api/schema/", {"format": "json"}).json()


def documented(schema, method: str, path: str) -> set[int]:
    return {int(code) for code in schema["paths"][path][method]["responses"]}


def test_each_answer_is_documented(schema, as_alex, legal):
    answers = [
        (
            "post",
            "/api/v1/notification-preferences/",
            as_alex.post(
                "/api/v1/notification-preferences/",
                {"kind": "version.approved", "channel": "off"},
                format="json",
            ),
        ),
        ("get", "/api/v1/notifications/", as_alex.get("/api/v1/notifications/")),
        (
            "post",
            "/api/v1/notifications/read-all/",
            as_alex.post("/api/v1/notifications/read-all/"),
        ),
    ]
    created = as_alex.post(
        "/api/v1/webhooks/", {"department": "legal", "url": PUBLIC_URL}, format="json"
    )
    answers.append(("post", "/api/v1/webhooks/", created))
    pk = created.json()["id"]
    answers.append(
        (
            "get",
            "/api/v1/webhooks/{id}/deliveries/",
            as_alex.get(f"/api/v1/webhooks/{pk}/deliveries/"),
        )
    )
    answers.append(("delete", "/api/v1/webhooks/{id}/", as_alex.delete(f"/api/v1/webhooks/{pk}/")))
    for method, path, response in answers:
        assert response.status_code < 300, (path, response.content[:300])
        assert response.status_code in documented(schema, method, path), (method, path)
