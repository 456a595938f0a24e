"""Kuadrant policies (serving/door/kuadrant.py): what a deployment's keys,
grants and limits render to is valid under the upstream CRDs vendored in
deploy/crds/kuadrant-operator/ (strict jsonschema), says the same as the
door's own table, and holds no key material."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from serving.door.callers import CallerKey, DoorAccess
from serving.door.kuadrant import (
    DEPARTMENT_ANNOTATION,
    KEY_ID_ANNOTATION,
    KEY_LABELS,
    key_secret_template,
    policies,
    render_yaml,
)
from serving.models import ServedAdapter
from serving.rules.quotas import DepartmentLimitsView, KeyLimits
from serving.services.grants import grant_decide, grant_request
from serving.services.inference_keys import inference_key_issue
from serving.services.limits import department_limits_set, inference_key_limits_set
from tests.conftest import actor
from tests.support import crd_schemas

CRDS = (
    Path(__file__).resolve().parents[2]
    / "deploy/crds/kuadrant-operator/v1.5.2-ffa34c7d81106b15e6fdc160f0fb4038f5bd554a"
)
SCHEMAS = crd_schemas.load(CRDS)
HOUR = int(time.time()) + 3600


def access() -> DoorAccess:
    return DoorAccess(
        deployment="prod-gpu",
        keys={"ab" * 32: CallerKey(1, "legal", HOUR), "cd" * 32: CallerKey(2, "finance", HOUR)},
        allowed=frozenset(
            {
                ("legal", "tiny-llama"),
                ("legal", "legal-contracts"),
                ("finance", "tiny-llama"),
                ("finance", "legal-contracts"),  # a grant
            }
        ),
    )


def rendered(**extra) -> list[dict]:
    return policies(
        access(),
        base_model="tiny-llama",
        keys={1: KeyLimits("legal", requests_per_minute=30, tokens_per_minute=2000)},
        departments={
            "legal": DepartmentLimitsView(
                requests_per_minute=600,
                tokens_per_minute=50_000,
                tokens_per_day=1_000_000,
                tokens_per_month=20_000_000,
            ),
            "finance": DepartmentLimitsView(tokens_per_day=10_000),
        },
        route="prod-gpu",
        namespace="models",
        **extra,
    )


def test_the_policies_are_valid_under_the_upstream_crds():
    documents = rendered()
    assert [d["kind"] for d in documents] == [
        "AuthPolicy",
        "RateLimitPolicy",
        "TokenRateLimitPolicy",
    ]
    for document in documents:
        assert crd_schemas.problems(SCHEMAS, document) == [], document["kind"]
        # The CRDs' CEL rule on targetRef, which jsonschema does not run.
        target = document["spec"]["targetRef"]
        assert target["group"] == "gateway.networking.k8s.io"
        assert target["kind"] in ("HTTPRoute", "Gateway")
        assert document["metadata"]["namespace"] == "models"


def test_the_strict_check_catches_a_field_the_crd_does_not_define():
    auth = rendered()[0]
    auth["spec"]["rules"]["authentication"]["inference-keys"]["apiKey"]["labels"] = {}
    assert crd_schemas.problems(SCHEMAS, auth)


def test_keys_are_secrets_selected_by_label_and_none_is_rendered():
    auth = rendered()[0]
    keys = auth["spec"]["rules"]["authentication"]["inference-keys"]
    assert keys["apiKey"]["selector"] == {"matchLabels": KEY_LABELS}
    assert keys["credentials"] == {"authorizationHeader": {"prefix": "Bearer"}}
    text = yaml.safe_dump_all(rendered())
    assert "ab" * 32 not in text and "cd" * 32 not in text
    identity = auth["spec"]["rules"]["response"]["success"]["filters"]["identity"]["json"]
    assert identity["properties"]["department"]["selector"].endswith(
        "lora-adapter-registry\\.io/department"
    )


def test_the_rego_allows_exactly_the_door_s_department_and_model_pairs():
    rego = rendered()[0]["spec"]["rules"]["authorization"]["models-of-the-department"]["opa"][
        "rego"
    ]
    first = rego.splitlines()[0]
    assert first == (
        'models := {"finance": ["legal-contracts", "tiny-llama"], '
        '"legal": ["legal-contracts", "tiny-llama"]}'
    )
    assert 'object.get(body, "model", "tiny-llama")' in rego  # no model: the base model's


def test_limits_per_key_and_per_department_with_kuadrant_s_windows():
    _, requests, tokens = rendered()
    assert requests["spec"]["limits"] == {
        "department-legal": {
            "rates": [{"limit": 600, "window": "1m"}],
            "when": [{"predicate": 'auth.identity.department == "legal"'}],
        },
        "key-1": {
            "rates": [{"limit": 30, "window": "1m"}],
            "when": [{"predicate": 'auth.identity.key_id == "1"'}],
        },
    }
    assert tokens["spec"]["limits"]["department-legal"]["rates"] == [
        {"limit": 50_000, "window": "1m"},
        {"limit": 1_000_000, "window": "24h"},
        {"limit": 20_000_000, "window": "720h"},
    ]
    assert tokens["spec"]["limits"]["department-finance"]["rates"] == [
        {"limit": 10_000, "window": "24h"}
    ]
    assert tokens["spec"]["limits"]["key-1"]["rates"] == [{"limit": 2000, "window": "1m"}]


def test_no_limits_render_the_auth_policy_alone():
    documents = policies(
        access(), base_model="tiny-llama", keys={}, departments={}, route="r", namespace=""
    )
    assert [d["kind"] for d in documents] == ["AuthPolicy"]
    assert "namespace" not in documents[0]["metadata"]


def test_a_key_s_secret_template_carries_the_labels_and_annotations_but_no_key():
    secret = key_secret_template(7, "legal", namespace="models")
    assert secret["metadata"]["labels"] == KEY_LABELS
    assert secret["metadata"]["annotations"] == {
        DEPARTMENT_ANNOTATION: "legal",
        KEY_ID_ANNOTATION: "7",
    }
    assert secret["stringData"] == {"api_key": "<the key, from its holder>"}


@pytest.mark.django_db
def test_a_deployment_renders_its_keys_grants_and_limits_from_the_database(
    deployment, approved_v1, root, alex, fred, finance, legal
):
    ServedAdapter.objects.create(
        deployment=deployment, adapter=approved_v1.adapter, version=approved_v1, served_path="/v"
    )
    key, secret = inference_key_issue(
        actor=actor(alex), department=legal, name="app", expires_in_days=5
    )
    department_limits_set(actor=actor(root), department=legal, changes={"requests_per_minute": 100})
    inference_key_limits_set(actor=actor(alex), key=key, changes={"tokens_per_minute": 900})
    grant = grant_request(
        actor=actor(fred),
        department=finance,
        served_name="legal-contracts",
        expires_in_days=5,
        reason="audit",
    )
    grant_decide(actor=actor(alex), grant=grant, approve=True)

    text = render_yaml(deployment)
    documents = list(yaml.safe_load_all(text))
    for document in documents:
        assert crd_schemas.problems(SCHEMAS, document) == [], document["kind"]
    assert secret not in text and key.secret_sha256 not in text
    rego = documents[0]["spec"]["rules"]["authorization"]["models-of-the-department"]["opa"]
    assert '"finance": ["legal-contracts", "tiny-llama"]' in rego["rego"]
    assert documents[1]["spec"]["limits"]["department-legal"]["rates"] == [
        {"limit": 100, "window": "1m"}
    ]
    assert documents[2]["spec"]["limits"][f"key-{key.pk}"]["rates"] == [
        {"limit": 900, "window": "1m"}
    ]


@pytest.mark.django_db
def test_the_command_prints_the_policies_and_refuses_an_unknown_deployment(deployment):
    from io import StringIO

    from django.core.management import CommandError, call_command

    out = StringIO()
    call_command("export_kuadrant", deployment.name, "--route", "chat", stdout=out)
    documents = list(yaml.safe_load_all(out.getvalue()))
    assert documents[0]["spec"]["targetRef"]["name"] == "chat"
    with pytest.raises(CommandError, match="No deployment named 'nope'"):
        call_command("export_kuadrant", "nope")
