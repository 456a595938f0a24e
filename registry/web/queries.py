"""Reads that only the web pages need. Each starts from a registry selector,
so visibility is the selectors' and never re-decided here, and each runs a
fixed number of queries however much data there is."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import QuerySet

from core import selectors as core_selectors
from core.access import ADMIN
from core.actors import Actor
from core.models import AuditEvent, Department, Membership
from registry import selectors
from registry.models import Adapter, AdapterVersion
from registry.models import VersionStatus as S


@dataclass(frozen=True)
class DepartmentRole:
    department: Department
    role: str  # "member", "approver" or "admin"


def my_departments(actor: Actor) -> list[DepartmentRole]:
    if actor.is_platform_admin:
        return [DepartmentRole(d, ADMIN) for d in core_selectors.departments_for(actor)]
    rows = Membership.objects.filter(user=actor.user).select_related("department")
    return [DepartmentRole(m.department, m.role) for m in rows.order_by("department__slug")]


def adapter_versions(actor: Actor, adapter: Adapter) -> QuerySet[AdapterVersion]:
    return selectors.versions_for(actor).filter(adapter=adapter).order_by("-number")


def version_audit_trail(actor: Actor, version: AdapterVersion) -> QuerySet[AuditEvent]:
    return core_selectors.audit_events_for(actor).filter(
        object_type=AdapterVersion._meta.label_lower, object_id=str(version.pk)
    )


def approved_versions_by_adapter(actor: Actor, adapter_ids: set[int]) -> dict[int, AdapterVersion]:
    """The currently approved (newest approved) version of each adapter, in one query."""
    current: dict[int, AdapterVersion] = {}
    rows = (
        selectors.versions_for(actor)
        .filter(adapter_id__in=adapter_ids, status=S.APPROVED)
        .order_by("adapter_id", "-number")
    )
    for version in rows:
        current.setdefault(version.adapter_id, version)
    return current
