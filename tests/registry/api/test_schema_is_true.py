"""What schemathesis found the API doing that its schema did not say (issue 14),
one test each, so a regression fails here in seconds rather than in the
contract tier (tests/contract)."""

from __future__ import annotations

import pytest
from django.test import Client
from drf_spectacular.generators import SchemaGenerator

from tests.factories import make_adapter, make_version

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def schema(django_db_blocker):
    with django_db_blocker.unblock():
        return SchemaGenerator().get_schema(request=None, public=True)


def operations(schema):
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            yield path, method.upper(), operation


def test_every_authenticated_operation_documents_the_error_envelope(schema):
    envelope = {"$ref": "#/components/schemas/ErrorEnvelope"}
    for path, method, operation in operations(schema):
        responses = operation["responses"]
        if path == "/livez":
            continue
        if path == "/readyz":
            assert responses["503"]
            continue
        if path == "/api/v1/mlflow/webhooks/":
            # No person or token: MLflow's signature is checked instead (401 when wrong).
            assert "403" not in responses
            assert {"401", "404", "413"} <= set(responses)
            assert responses["401"]["content"]["application/json"]["schema"] == envelope
            continue
        for code in ("401", "403"):
            assert responses[code]["content"]["application/json"]["schema"] == envelope, (
                method,
                path,
                code,
            )
        if "{" in path:
            assert "404" in responses, (method, path)
        if method in {"POST", "PUT", "PATCH", "DELETE"}:
            assert {"400", "404", "409"} <= set(responses), (method, path)
    upload = schema["paths"]["/api/v1/adapters/{id}/versions/"]["post"]["responses"]
    assert {"413", "415", "503"} <= set(upload)


def test_people_who_have_not_acted_yet_are_nullable(schema):
    version = schema["components"]["schemas"]["Version"]["properties"]
    assert version["reviewed_by"].get("nullable") is True
    assert version["submitted_by"].get("nullable") is True


def test_page_size_bounds_are_declared(schema):
    params = schema["paths"]["/api/v1/versions/"]["get"]["parameters"]
    size = next(p for p in params if p["name"] == "page_size")
    assert (size["schema"]["minimum"], size["schema"]["maximum"]) == (1, 500)


@pytest.mark.parametrize("query", ["page_size=0", "page_size=501", "page_size=abc", "page=0"])
def test_a_page_parameter_out_of_its_bounds_is_a_400(as_token, legal, query):
    response = as_token.get(f"/api/v1/versions/?{query}")

    assert response.status_code == 400, response.json()
    assert response.json()["error"]["code"].startswith("invalid_page")


def test_memberships_are_paginated_as_documented(as_lena, legal, alex):
    body = as_lena.get("/api/v1/departments/legal/memberships/?page_size=1").json()

    assert body["count"] == 2
    assert len(body["results"]) == 1
    assert body["next"]


@pytest.mark.parametrize(
    ("url", "code"),
    [("/api/v1/versions/?number=0.5", 400), ("/api/v1/audit-events/?until=", 400)],
)
def test_a_filter_value_of_the_wrong_type_is_refused(as_token, legal, url, code):
    assert as_token.get(url).status_code == code


def test_an_unknown_adapter_id_filters_to_nothing(as_token, legal):
    response = as_token.get("/api/v1/rollouts/?adapter=999999")

    assert response.status_code == 200
    assert response.json()["count"] == 0


def test_an_unknown_api_path_answers_the_json_error(as_token):
    response = as_token.post("/api/v1/versions/0.5/submit/")

    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json()["error"]["code"] == "not_found"


def test_a_post_to_an_unknown_api_path_with_a_session_is_not_an_html_403(lena):
    client = Client(enforce_csrf_checks=True)
    client.force_login(lena)

    response = client.post("/api/v1/versions/0.5/submit/")

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_credentials_of_another_scheme_are_refused_not_ignored(lena):
    client = Client()
    client.force_login(lena)  # a valid session must not rescue an invalid header

    response = client.get("/api/v1/adapters/", HTTP_AUTHORIZATION="Basic bGVuYTp4")

    assert response.status_code == 401
    assert response.json()["error"]["code"] == "authentication_failed"


def test_an_unreviewed_version_shows_reviewed_by_null(as_lena, lena, legal):
    version = make_version(lena, make_adapter(lena, legal))

    body = as_lena.get(f"/api/v1/versions/{version.pk}/").json()

    assert body["reviewed_by"] is None


def test_a_session_is_a_documented_way_to_call_the_api(schema):
    assert schema["components"]["securitySchemes"]["cookieAuth"]["in"] == "cookie"
    for path, method, operation in operations(schema):
        if path not in ("/livez", "/readyz", "/api/v1/mlflow/webhooks/"):
            assert {"cookieAuth": []} in operation["security"], (method, path)
