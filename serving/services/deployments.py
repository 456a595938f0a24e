"""Deployments are created and changed by platform admins only."""

from __future__ import annotations

import re

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import ProtectedError

from core.access import require_platform_admin
from core.actors import Actor
from core.audit import audit_record
from core.errors import Conflict, ValidationFailed
from serving.attestation import discovery_of
from serving.capacity import SHAPE_FIELDS
from serving.discovery.kubernetes import label_selector_problem, namespace_problem
from serving.enqueue import door_access_enqueue
from serving.models import Deployment, VersionFingerprint
from serving.rules.base_models import identity_from_path, module_dims_for

# The base model's identity: its architecture and the shape the pool model needs.
IDENTITY_FIELDS = ("architecture", *SHAPE_FIELDS)
# Never echoed into audit details.
SECRET_FIELDS = {"vllm_api_key"}


def _apply(deployment: Deployment, values: dict) -> list[str]:
    values = dict(values)
    departments = values.pop("allowed_departments", None)
    base_model_path = values.pop("base_model_path", None)
    if base_model_path:
        identity = identity_from_path(base_model_path)
        for name in IDENTITY_FIELDS:
            values.setdefault(name, identity.get(name))
        values.setdefault("module_dims", identity["module_dims"])
        aliases = list(values.get("base_model_aliases", deployment.base_model_aliases) or [])
        if base_model_path not in aliases:
            aliases.append(base_model_path)
        values["base_model_aliases"] = aliases
    changed = []
    for name, value in values.items():
        if getattr(deployment, name) != value:
            setattr(deployment, name, value)
            changed.append(name)
    if not deployment.module_dims and deployment.hidden_size:
        deployment.module_dims = module_dims_for(
            {name: getattr(deployment, name) for name in IDENTITY_FIELDS}
        )
    _check_discovery(deployment)
    for url in deployment.replica_urls or []:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValidationFailed(f"Replica URL {url!r} must start with http:// or https://.")
    # The same invariants are CheckConstraints on the model (for every writer);
    # checked here first so that the answer names the field.
    if deployment.max_loras > deployment.max_cpu_loras:
        raise ValidationFailed(
            "max_loras cannot exceed max_cpu_loras (vLLM refuses to start).",
            details={"field": "max_loras"},
        )
    _check_registered_limit(deployment)
    _check_resources(deployment.runtime_resources)
    if not 0 < deployment.gpu_memory_utilization <= 1:
        raise ValidationFailed(
            "gpu_memory_utilization must be a fraction between 0 and 1.",
            details={"field": "gpu_memory_utilization"},
        )
    if not 0 < deployment.lora_memory_share <= 1:
        raise ValidationFailed(
            "lora_memory_share must be a fraction between 0 and 1.",
            details={"field": "lora_memory_share"},
        )
    try:
        deployment.full_clean(exclude=["allowed_departments"])
    except ValidationError as error:
        raise ValidationFailed(
            "; ".join(f"{k}: {' '.join(v)}" for k, v in error.message_dict.items())
        ) from None
    deployment._departments = departments
    return changed


def _check_registered_limit(deployment: Deployment) -> None:
    limit = deployment.max_registered_adapters
    if limit < 1:
        raise ValidationFailed(
            "max_registered_adapters must be at least 1.",
            details={"field": "max_registered_adapters"},
        )
    if deployment.pk is None:
        return
    served = deployment.served_adapters.filter(version__isnull=False).count()
    if limit < served:
        # Lowering it would not unload anything; it would only leave the limit a lie.
        raise ValidationFailed(
            f"max_registered_adapters {limit} is below the {served} adapters this deployment "
            "serves: retire some first.",
            details={"field": "max_registered_adapters"},
        )


def _check_resources(resources) -> None:
    shape = 'runtime_resources must look like {"requests": {"cpu": "4"}, "limits": {...}}'
    if not isinstance(resources, dict) or set(resources) - {"requests", "limits"}:
        raise ValidationFailed(shape + ".")
    for part in resources.values():
        if not isinstance(part, dict) or not all(
            isinstance(k, str) and isinstance(v, str | int) for k, v in part.items()
        ):
            raise ValidationFailed(shape + ": names to quantities.")


def _check_discovery(deployment: Deployment) -> None:
    kubernetes = bool(deployment.kubernetes_namespace or deployment.kubernetes_label_selector)
    ways = [bool(deployment.replica_urls), bool(deployment.replica_dns_name), kubernetes]
    if not any(ways):
        raise ValidationFailed(
            "Give the replicas: replica_urls, replica_dns_name, or kubernetes_namespace "
            "with kubernetes_label_selector.",
            code="no_replicas",
        )
    if sum(ways) > 1:
        raise ValidationFailed(
            "Give one way to find replicas: replica_urls, replica_dns_name or Kubernetes.",
            code="ambiguous_replicas",
        )
    if kubernetes:
        problem = namespace_problem(deployment.kubernetes_namespace) or label_selector_problem(
            deployment.kubernetes_label_selector
        )
        if not problem and not _SERVICE_NAME.match(deployment.kubernetes_service_name):
            problem = (
                "kubernetes_service_name must name the Service whose endpoints are the "
                "replicas (a DNS label): the vLLM API key goes to its endpoints only"
            )
        if problem:
            raise ValidationFailed(f"Kubernetes discovery: {problem}.", code="bad_kubernetes")


_SERVICE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


def _save(actor: Actor, deployment: Deployment, action: str, changed: list[str]) -> Deployment:
    try:
        with transaction.atomic():
            deployment.save()
            if deployment._departments is not None:
                deployment.allowed_departments.set(deployment._departments)
            audit_record(
                actor=actor,
                action=action,
                obj=deployment,
                department=None,
                details={
                    "changed": [c for c in changed if c not in SECRET_FIELDS]
                    + (["vllm_api_key"] if "vllm_api_key" in changed else []),
                    # Where the vLLM key may go, chained: a restore checks it
                    # (serving/attestation.py).
                    "discovery": discovery_of(deployment),
                },
            )
    except IntegrityError:
        raise Conflict(f"A deployment named {deployment.name!r} already exists.") from None
    return deployment


def deployment_create(*, actor: Actor, **values) -> Deployment:
    require_platform_admin(actor)
    deployment = Deployment()
    changed = _apply(deployment, values)
    return _save(actor, deployment, "deployment.created", changed)


# What the front door's access table reads of a deployment (door_access): a new
# vLLM API key is sent upstream by the door from the next request after the push.
DOOR_ACCESS_FIELDS = {"open_door", "base_model_name", "name", "vllm_api_key"}


def deployment_update(*, actor: Actor, deployment: Deployment, **values) -> Deployment:
    require_platform_admin(actor)
    changed = _apply(deployment, values)
    with transaction.atomic():
        deployment = _save(actor, deployment, "deployment.updated", changed)
        if set(changed) & DOOR_ACCESS_FIELDS or deployment._departments is not None:
            door_access_enqueue([deployment.pk])
    if set(changed) & {"revision", *IDENTITY_FIELDS}:
        # Other base weights answer the probe differently through the same adapter.
        VersionFingerprint.objects.filter(deployment=deployment).delete()
    return deployment


def deployment_delete(*, actor: Actor, deployment: Deployment) -> None:
    require_platform_admin(actor)
    if deployment.served_adapters.filter(version__isnull=False).exists():
        raise Conflict(
            f"{deployment.name} still serves adapters; retire them first.", code="still_serving"
        )
    try:
        with transaction.atomic():
            audit_record(actor=actor, action="deployment.deleted", obj=deployment, department=None)
            deployment.delete()
    except ProtectedError:
        # Promotions and rollouts are the record of what was served where; they outlive
        # nothing they describe, so a deployment with history stays (retired, not deleted).
        raise Conflict(
            f"{deployment.name} has promotions or rollouts on record, which are kept for the "
            "audit; retire its adapters and leave it, or remove its replicas instead.",
            code="has_history",
        ) from None
