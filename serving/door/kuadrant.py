"""Kuadrant policies for a deployment, for clusters whose gateway is Kuadrant
(OpenShift AI's Models-as-a-Service): the same keys, grants and limits as this
product's own front door, as an AuthPolicy, a RateLimitPolicy and a
TokenRateLimitPolicy attached to the deployment's HTTPRoute.

- AuthPolicy (kuadrant.io/v1): API keys are Kubernetes Secrets that Authorino
  selects by label (`KEY_LABELS`); each carries its department and key id as
  annotations (`DEPARTMENT_ANNOTATION`, `KEY_ID_ANNOTATION`), exposed as
  `auth.identity.department` and `auth.identity.key_id`. Who may call which
  model (own adapters, the base model, grants) is a Rego rule on the body's
  `model`. No key material is rendered: a key's secret exists only in its
  holder's hands and in the Secret they (or the platform) create.
- RateLimitPolicy (kuadrant.io/v1): requests per minute per key and per
  department.
- TokenRateLimitPolicy (kuadrant.io/v1alpha1): tokens per minute per key and
  per department, and the day and month budgets (Kuadrant counts fixed
  windows of 24h and 720h, not calendar days and months).

Schemas: kuadrant-operator v1.5.2, vendored in deploy/crds/kuadrant-operator/;
the tests validate what this renders against them. docs/door.md, "Kubernetes".
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

import yaml

from serving.door.callers import DoorAccess
from serving.rules.quotas import DepartmentLimitsView, KeyLimits

AUTH_API = "kuadrant.io/v1"
RATE_API = "kuadrant.io/v1"
TOKEN_LIMIT_API = "kuadrant.io/v1alpha1"  # noqa: S105 - an API version, not a secret
# The labels every inference key's Secret carries, and the annotations that
# say who it calls as. Authorino reads the key from the Secret's `api_key`.
KEY_LABELS = {
    "app.kubernetes.io/managed-by": "lora-adapter-registry",
    "lora-adapter-registry.io/inference-key": "true",
}
DEPARTMENT_ANNOTATION = "lora-adapter-registry.io/department"
KEY_ID_ANNOTATION = "lora-adapter-registry.io/key-id"
# Kuadrant's windows are durations: a "month" is 30 days here.
WINDOWS = {
    "tokens_per_minute": "1m",
    "tokens_per_day": "24h",
    "tokens_per_month": "720h",
}


def _selector(annotation: str) -> str:
    # gjson paths escape the dots of an annotation's name.
    return "auth.identity.metadata.annotations." + annotation.replace(".", "\\.")


def _metadata(name: str, namespace: str) -> dict:
    metadata = {"name": name, "labels": {"app.kubernetes.io/managed-by": "lora-adapter-registry"}}
    if namespace:
        metadata["namespace"] = namespace
    return metadata


def _rego(allowed: frozenset[tuple[str, str]], base_model: str) -> str:
    """Allow a request whose body's `model` its department may call (its own
    adapters, the base model, granted ones); as the door does, a request without
    `model` is the base model's. Rego v1 (Authorino's OPA 1.x); names are
    JSON-quoted, which Rego's strings are."""
    pairs: dict[str, list[str]] = {}
    for department, model in sorted(allowed):
        pairs.setdefault(department, []).append(model)
    annotations = "input.auth.identity.metadata.annotations"
    return "\n".join(
        [
            f"models := {json.dumps(pairs, sort_keys=True)}",
            "body := json.unmarshal(input.context.request.http.body)",
            f'department := object.get({annotations}, {json.dumps(DEPARTMENT_ANNOTATION)}, "")',
            'model := object.get(body, "model", ' + json.dumps(base_model) + ")",
            "allow if {",
            "    some name in models[department]",
            "    name == model",
            "}",
            "",
        ]
    )


def policies(
    access: DoorAccess,
    *,
    base_model: str,
    keys: Mapping[int, KeyLimits],
    departments: Mapping[str, DepartmentLimitsView],
    route: str,
    namespace: str = "",
) -> list[dict]:
    """[AuthPolicy, RateLimitPolicy, TokenRateLimitPolicy] for the HTTPRoute
    `route`. The last two are left out when no limit of their kind is set."""
    target = {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": route}
    name = access.deployment
    rego = _rego(access.allowed, base_model)
    auth = {
        "apiVersion": AUTH_API,
        "kind": "AuthPolicy",
        "metadata": _metadata(f"{name}-keys", namespace),
        "spec": {
            "targetRef": target,
            "rules": {
                "authentication": {
                    "inference-keys": {
                        "apiKey": {
                            "selector": {"matchLabels": dict(KEY_LABELS)},
                            "allNamespaces": False,
                        },
                        "credentials": {"authorizationHeader": {"prefix": "Bearer"}},
                    }
                },
                "authorization": {"models-of-the-department": {"opa": {"rego": rego}}},
                "response": {
                    "success": {
                        "filters": {
                            "identity": {
                                "json": {
                                    "properties": {
                                        "department": {
                                            "selector": _selector(DEPARTMENT_ANNOTATION)
                                        },
                                        "key_id": {"selector": _selector(KEY_ID_ANNOTATION)},
                                    }
                                }
                            }
                        }
                    }
                },
            },
        },
    }
    requests = _limits_by_caller(
        departments,
        keys,
        department_rates=lambda limits: _per_minute(limits.requests_per_minute),
        key_rates=lambda limits: _per_minute(limits.requests_per_minute),
    )
    tokens = _limits_by_caller(
        departments,
        keys,
        department_rates=lambda limits: [
            {"limit": getattr(limits, kind), "window": window}
            for kind, window in WINDOWS.items()
            if getattr(limits, kind)
        ],
        key_rates=lambda limits: _per_minute(limits.tokens_per_minute),
    )

    def limit_policy(api: str, kind: str, suffix: str, limits: dict) -> list[dict]:
        """The policy, or nothing when no caller has a limit of its kind."""
        if not limits:
            return []
        return [
            {
                "apiVersion": api,
                "kind": kind,
                "metadata": _metadata(f"{name}-{suffix}", namespace),
                "spec": {"targetRef": target, "limits": limits},
            }
        ]

    return [
        auth,
        *limit_policy(RATE_API, "RateLimitPolicy", "requests", requests),
        *limit_policy(TOKEN_LIMIT_API, "TokenRateLimitPolicy", "tokens", tokens),
    ]


def _per_minute(limit: int | None) -> list[dict]:
    return [{"limit": limit, "window": "1m"}] if limit else []


def _limits_by_caller(
    departments: Mapping[str, DepartmentLimitsView],
    keys: Mapping[int, KeyLimits],
    *,
    department_rates: Callable[[DepartmentLimitsView], list[dict]],
    key_rates: Callable[[KeyLimits], list[dict]],
) -> dict:
    """A policy's `limits`: one entry per department and per key with a rate
    of its kind, each matched on the identity the AuthPolicy passes on."""
    limits = {}
    for slug, department in sorted(departments.items()):
        if rates := department_rates(department):
            predicate = f'auth.identity.department == "{slug}"'
            limits[f"department-{slug}"] = {"rates": rates, "when": [{"predicate": predicate}]}
    for key_id, key in sorted(keys.items()):
        if rates := key_rates(key):
            predicate = f'auth.identity.key_id == "{key_id}"'
            limits[f"key-{key_id}"] = {"rates": rates, "when": [{"predicate": predicate}]}
    return limits


def key_secret_template(key_id: int, department: str, namespace: str = "") -> dict:
    """The Secret an inference key's holder creates for Authorino: labels and
    annotations as the AuthPolicy selects them, `api_key` for them to fill in.
    Never rendered with a key in it: the product does not have it."""
    metadata = {
        "name": f"inference-key-{key_id}",
        "labels": dict(KEY_LABELS),
        "annotations": {DEPARTMENT_ANNOTATION: department, KEY_ID_ANNOTATION: str(key_id)},
    }
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "stringData": {"api_key": "<the key, from its holder>"},
        "type": "Opaque",
    }


def render_yaml(deployment, *, route: str | None = None) -> str:
    """The deployment's Kuadrant policies as YAML, from the database as it is now."""
    from serving.door.selectors import door_access, live_inference_keys
    from serving.quota_selectors import department_limits, key_limits

    header = (
        f"# Kuadrant policies for deployment {deployment.name}, rendered by the LoRA adapter\n"
        "# registry. API keys are Secrets selected by label: none is in here.\n"
        "# Re-render after a change of keys, grants or limits.\n"
    )
    documents = policies(
        door_access(deployment),
        base_model=deployment.base_model_name,
        keys=key_limits(live_inference_keys()),
        departments=department_limits(),
        route=route or deployment.name,
        namespace=deployment.kubernetes_namespace,
    )
    return header + yaml.safe_dump_all(documents, sort_keys=False)
