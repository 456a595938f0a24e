"""Allowed artifact sources per department: platform admins only, audited."""

from __future__ import annotations

from django.db import IntegrityError, transaction

from core.access import require_platform_admin
from core.actors import Actor
from core.audit import audit_record
from core.errors import Conflict, ValidationFailed
from core.models import Department
from registry.models import ArtifactSource
from registry.source_policy import normalize_s3_uri, overlaps_registry_store

FIELDS = ("uri_prefix", "endpoint_url", "region", "access_key_id", "secret_access_key")


def _apply(source: ArtifactSource, values: dict) -> list[str]:
    unknown = set(values) - set(FIELDS)
    if unknown:
        raise ValidationFailed(f"Unknown fields: {', '.join(sorted(unknown))}.")
    if "uri_prefix" in values:
        prefix = normalize_s3_uri(values["uri_prefix"], folder=True)
        if overlaps_registry_store(prefix):
            raise ValidationFailed(
                f"{prefix} overlaps the registry's own artifact store, which is never a source.",
                code="source_is_registry_store",
            )
        values = {**values, "uri_prefix": prefix}
    endpoint = values.get("endpoint_url")
    if endpoint and not endpoint.startswith(("http://", "https://")):
        raise ValidationFailed("endpoint_url must start with http:// or https://.")
    changed = []
    for name, value in values.items():
        if getattr(source, name) != value:
            setattr(source, name, value)
            changed.append(name)
    if source.access_key_id and not source.secret_access_key:
        raise ValidationFailed(
            "Give secret_access_key with access_key_id.", code="incomplete_credentials"
        )
    return changed


def _save(actor: Actor, source: ArtifactSource, action: str, changed: list[str]):
    try:
        with transaction.atomic():
            source.save()
            audit_record(
                actor=actor,
                action=action,
                obj=source,
                department=source.department,
                # The secret is never echoed; only that it changed.
                details={"changed": changed, "uri_prefix": source.uri_prefix},
            )
    except IntegrityError:
        raise Conflict(
            f"{source.department.slug} already has the source {source.uri_prefix}."
        ) from None
    return source


def artifact_source_create(
    *, actor: Actor, department: Department, uri_prefix: str, **values
) -> ArtifactSource:
    require_platform_admin(actor)
    source = ArtifactSource(department=department)
    changed = _apply(source, {"uri_prefix": uri_prefix, **values})
    return _save(actor, source, "artifact_source.created", changed)


def artifact_source_update(*, actor: Actor, source: ArtifactSource, **values) -> ArtifactSource:
    require_platform_admin(actor)
    changed = _apply(source, values)
    return _save(actor, source, "artifact_source.updated", changed)


def artifact_source_delete(*, actor: Actor, source: ArtifactSource) -> None:
    require_platform_admin(actor)
    with transaction.atomic():
        audit_record(
            actor=actor,
            action="artifact_source.deleted",
            obj=source,
            department=source.department,
            details={"uri_prefix": source.uri_prefix},
        )
        source.delete()
