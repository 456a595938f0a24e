"""The OpenAPI 3 document is valid, complete and secured; the docs page is self-hosted."""

from __future__ import annotations

import re

import pytest
from django.urls import URLPattern, URLResolver, get_resolver
from openapi_spec_validator import validate

pytestmark = pytest.mark.django_db

REGISTRY_OPERATIONS = [
    ("get", "/api/v1/departments/"),
    ("post", "/api/v1/departments/"),
    ("get", "/api/v1/departments/{slug}/"),
    ("get", "/api/v1/departments/{slug}/memberships/"),
    ("post", "/api/v1/departments/{slug}/memberships/"),
    ("delete", "/api/v1/departments/{slug}/memberships/{username}/"),
    ("get", "/api/v1/adapters/"),
    ("post", "/api/v1/adapters/"),
    ("get", "/api/v1/adapters/{id}/"),
    ("patch", "/api/v1/adapters/{id}/"),
    ("get", "/api/v1/adapters/{id}/versions/"),
    ("post", "/api/v1/adapters/{id}/versions/"),
    ("get", "/api/v1/versions/"),
    ("get", "/api/v1/versions/{id}/"),
    ("post", "/api/v1/versions/{id}/submit/"),
    ("post", "/api/v1/versions/{id}/approve/"),
    ("post", "/api/v1/versions/{id}/reject/"),
    ("post", "/api/v1/versions/{id}/deprecate/"),
    ("post", "/api/v1/versions/{id}/archive/"),
    ("get", "/api/v1/audit-events/"),
    ("get", "/api/v1/audit-events/{id}/"),
    ("get", "/api/v1/tokens/"),
    ("post", "/api/v1/tokens/"),
    ("get", "/api/v1/tokens/{id}/"),
    ("post", "/api/v1/tokens/{id}/revoke/"),
    ("get", "/livez"),
    ("get", "/readyz"),
]


@pytest.fixture
def schema(anonymous):
    response = anonymous.get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/vnd.oai.openapi+json")
    return response.json()


def test_the_schema_is_valid_openapi_3(schema):
    assert schema["openapi"].startswith("3.")
    validate(schema)


@pytest.mark.parametrize(("method", "path"), REGISTRY_OPERATIONS)
def test_every_registry_endpoint_is_documented(schema, method, path):
    assert path in schema["paths"], sorted(schema["paths"])
    assert method in schema["paths"][path]


def _api_routes(resolver, prefix=""):
    for entry in resolver.url_patterns:
        pattern = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            yield from _api_routes(entry, pattern)
        elif isinstance(entry, URLPattern):
            yield pattern


def _openapi_path(regex: str) -> str:
    path = regex.replace("^", "").replace("$", "")
    path = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", path)
    path = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", path)
    return "/" + path.replace("\\.", ".")


def test_every_routed_api_url_is_in_the_schema(schema):
    """Nothing under /api/v1/ is missing, whichever app added it."""
    routed = {
        _openapi_path(p)
        for p in _api_routes(get_resolver())
        if p.startswith("api/v1/") and "format" not in p
    }
    routed = {p.replace("{pk}", "{id}") for p in routed if p != "/api/v1/"}
    assert routed, "no API routes found"
    assert routed <= set(schema["paths"]), sorted(routed - set(schema["paths"]))


def test_bearer_security_scheme_is_declared_and_used(schema):
    schemes = schema["components"]["securitySchemes"]
    bearer = [s for s in schemes.values() if s.get("scheme") == "bearer"]
    assert bearer and bearer[0]["type"] == "http"
    name = next(n for n, s in schemes.items() if s.get("scheme") == "bearer")
    register = schema["paths"]["/api/v1/adapters/{id}/versions/"]["post"]
    assert {name: []} in register["security"]


def test_docs_page_uses_no_external_assets(anonymous):
    response = anonymous.get("/api/docs/")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    html = response.content.decode()
    assert "swagger" in html.lower()
    external = re.findall(r"""(?:src|href)=["']((?:https?:)?//[^"']+)""", html)
    assert external == [], external
    for cdn in ("cdn.jsdelivr", "unpkg.com", "cdnjs"):
        assert cdn not in html
    # The vendored assets it names are served by this app.
    assets = re.findall(r"""(?:src|href)=["'](/[^"']+\.(?:js|css))""", html)
    assert assets


def test_operations_are_grouped_by_resource_each_group_and_operation_described(schema):
    declared = {tag["name"]: tag.get("description", "") for tag in schema["tags"]}
    assert all(declared.values()), declared
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            if not isinstance(operation, dict) or "operationId" not in operation:
                continue
            where = f"{method.upper()} {path}"
            assert operation["tags"] != ["api"], where
            assert set(operation["tags"]) <= set(declared), (where, operation["tags"])
            assert operation.get("description") or operation.get("summary"), where


def test_the_api_docs_link_back_to_the_app(schema):
    assert "[Back to the app](/)" in schema["info"]["description"]
