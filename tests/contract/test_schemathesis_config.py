"""schemathesis.toml's exceptions apply to the operations they name and to no
other. An `[[operations]]` entry matches when ANY of its include filters does,
so `include-path-regex` with `include-method-regex` once excused every POST;
the entries name operations by "METHOD /path" instead, and this test holds them
to it."""

from __future__ import annotations

from pathlib import Path

import pytest
import schemathesis
from drf_spectacular.generators import SchemaGenerator
from schemathesis.config import SchemathesisConfig

pytestmark = pytest.mark.django_db

CONFIG = Path(__file__).resolve().parent / "schemathesis.toml"
DEFAULT = ["2xx", "3xx", "401", "403", "404", "409", "429", "5xx"]
EXCUSED = {
    "POST /api/v1/adapters/{id}/versions/": "400 413 415",
    "POST /api/v1/deployments/": "400",
    "PUT /api/v1/deployments/{name}/": "400",
    "PATCH /api/v1/deployments/{name}/": "400",
    "POST /api/v1/planner/": "400",
    "POST /api/v1/artifact-sources/": "400",
    "PATCH /api/v1/artifact-sources/{id}/": "400",
    "POST /api/v1/promotions/": "422",
    "POST /api/v1/promotions/{id}/approve/": "422",
    "POST /api/v1/deployments/{name}/rollback/": "422",
    "POST /api/v1/rollouts/{id}/rollback/": "422",
    "GET /api/v1/usage/": "400",
    "PUT /api/v1/deployments/{name}/placement/": "400",
    "POST /api/v1/inference-keys/": "400",
    "PATCH /api/v1/inference-keys/{id}/limits/": "400",
    "POST /api/v1/grants/": "400",
    "POST /api/v1/webhooks/": "400",
    "PATCH /api/v1/webhooks/{id}/": "400",
    "POST /api/v1/chat-channels/": "400",
    "PATCH /api/v1/chat-channels/{id}/": "400",
}


def test_each_exception_applies_to_the_operations_it_names_only():
    raw = SchemaGenerator().get_schema(request=None, public=True)
    schema = schemathesis.openapi.from_dict(raw, config=SchemathesisConfig.from_path(CONFIG))
    excused = {}
    for path, item in raw["paths"].items():
        for method in item:
            operation = schema[path][method.upper()]
            check = schema.config.operations.get_for_operation(operation).checks
            statuses = check.positive_data_acceptance.expected_statuses or DEFAULT
            extra = sorted(set(statuses) - set(DEFAULT))
            if extra:
                excused[f"{method.upper()} {path}"] = " ".join(extra)

    assert excused == EXCUSED
