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
    anonymous = {"/livez", "/readyz", "/api/v1/mlflow/webhooks/"}
    for path, method, operation in operations(schema):
        if path in anonymous:
            assert operation["security"] == [{}], (method, path)
        else:
            assert {"cookieAuth": []} in operation["security"], (method, path)


# What schemathesis found at 30 examples per operation (issue 18), one test each.


@pytest.fixture
def legal_cpu(root, legal, tmp_path):
    from serving.services.deployments import deployment_create
    from tests.conftest import actor

    deployment = deployment_create(
        actor=actor(root),
        name="legal-cpu",
        environment="staging",
        base_model_name="tiny-llama",
        replica_urls=["http://127.0.0.1:9"],
        volume_write_path=str(tmp_path),
        volume_serve_path=str(tmp_path),
    )
    deployment.allowed_departments.set([legal])
    return deployment


def test_a_deployment_reads_as_one_of_the_admin_and_the_member_shapes(schema):
    one_of = schema["components"]["schemas"]["DeploymentAsSeen"]["oneOf"]
    refs = {"#/components/schemas/Deployment", "#/components/schemas/DeploymentSummary"}

    assert {item["$ref"] for item in one_of} == refs
    detail = schema["paths"]["/api/v1/deployments/{name}/"]["get"]["responses"]["200"]
    assert detail["content"]["application/json"]["schema"]["$ref"].endswith("DeploymentAsSeen")


def test_kserve_documents_its_incomplete_deployment_409(schema, as_root, legal_cpu):
    # Platform admins only (issue 21): the manifests name volumes and the namespace.
    response = as_root.get("/api/v1/deployments/legal-cpu/kserve/")

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "kserve_incomplete"
    assert "409" in schema["paths"]["/api/v1/deployments/{name}/kserve/"]["get"]["responses"]


def test_a_members_deployment_write_is_refused_before_its_body_is_judged(as_token, legal_cpu):
    response = as_token.patch(
        "/api/v1/deployments/legal-cpu/", {"allowed_departments": ["nowhere"]}, format="json"
    )

    assert response.status_code == 403
    assert response.json()["error"]["code"] == "not_platform_admin"


def test_an_allowed_department_that_does_not_exist_is_a_404(as_root, legal_cpu):
    response = as_root.patch(
        "/api/v1/deployments/legal-cpu/",
        {"allowed_departments": ["legal", "nowhere"]},
        format="json",
    )

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "department_not_found"
    assert list(legal_cpu.allowed_departments.values_list("slug", flat=True)) == ["legal"]


def test_every_request_string_forbids_nul_in_the_schema(schema, as_token, legal):
    search = next(
        p
        for p in schema["paths"]["/api/v1/adapters/"]["get"]["parameters"]
        if p["name"] == "search"
    )
    comment = schema["components"]["schemas"]["TransitionRequest"]["properties"]["comment"]

    assert search["schema"]["pattern"] == comment["pattern"] == "^[^\\x00]*$"
    assert as_token.get("/api/v1/adapters/?search=a%00b").status_code == 400


def test_an_api_path_with_a_newline_answers_the_json_404(as_token):
    response = as_token.get("/api/v1/versions/a%0Ab/mlflow-mirror/")

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_request_bodies_are_documented_as_json_and_uploads_as_multipart(schema):
    for path, method, operation in operations(schema):
        content = set(operation.get("requestBody", {}).get("content", {}))
        if path == "/api/v1/adapters/{id}/versions/" and method == "POST":
            assert content == {"multipart/form-data", "application/json"}
        elif content:
            assert content == {"application/json"}, (method, path)


def test_usage_documents_its_csv_and_the_404_of_an_unseen_department(schema):
    operation = schema["paths"]["/api/v1/usage/"]["get"]
    assert set(operation["responses"]["200"]["content"]) == {"application/json", "text/csv"}
    assert {"400", "401", "403", "404"} <= set(operation["responses"])
    names = {p["name"] for p in operation["parameters"]}
    assert names == {"department", "from", "to", "format"}


def test_every_operation_that_runs_the_compatibility_gate_documents_its_422(schema):
    gated = [
        "/api/v1/promotions/",
        "/api/v1/promotions/{id}/approve/",
        "/api/v1/deployments/{name}/rollback/",
        "/api/v1/rollouts/{id}/rollback/",
    ]
    for path in gated:
        assert "422" in schema["paths"][path]["post"]["responses"], path


def test_scim_is_not_in_the_openapi_schema(schema):
    # /scim/v2/ is RFC 7644's protocol (django-scim2 views, not DRF): its
    # schemas are served by the endpoint itself (/scim/v2/Schemas) and
    # scim2-tester checks them (tests/sso/test_scim_conformance.py).
    assert not [path for path in schema["paths"] if path.startswith("/scim")]
