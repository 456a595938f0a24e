"""Adopt what is already served: an adapter loaded on a deployment's replicas that
the registry does not know (a stray, reported by the reconcile and left loaded)
becomes a managed, versioned adapter, served from what was reviewed.

1. A platform admin asks to adopt a stray into a department (adoption_create). Its
   files are read from the folder the replicas report as its root, only where the
   control plane can read it: inside the deployment's adapter volume or under
   SERVING_ADOPTION_ROOTS, never through a symlink out of it. They go through the
   normal ingest (version_register), so every validation applies, and the version
   must pass the deployment's compatibility gate. It is submitted for review.
2. An approver who is not that admin approves the version (four-eyes, as for any
   version). Then the adoption promotes it like any version (adoption_settle, on
   the version's transition): the deployment's allowed departments and its
   promotion approval apply, and the rollout stages the registry's copy of the
   reviewed files in the version's folder (checked against the ingested digests)
   and swaps the replicas to it, verified. The stray's folder, which anyone with
   the volume can change after the review, is never served again. A rejection
   leaves the stray a stray. docs/operators/adoption.md says the rest.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from core.access import require_platform_admin
from core.actors import Actor, system_actor
from core.audit import audit_record
from core.errors import ApplicationError, Conflict, NotAuthorized, NotFound, ValidationFailed
from core.models import Department
from registry.ingest.incoming import LocalFolder
from registry.models import Adapter, AdapterVersion, VersionStatus
from registry.services.adapters import adapter_create
from registry.services.versions import Lineage, version_register, version_transition
from serving.deploy_access import department_refusal
from serving.gate import evaluate_gate
from serving.models import Adoption, AdoptionStatus, Deployment, ServedAdapter
from serving.services.promotions import promotion_create
from serving.sync_state import loaded_adapters


def strays_of(deployment: Deployment) -> dict[str, dict]:
    """{served name: {"root", "replicas"}} of what replicas list and nothing serves."""
    managed = set(
        ServedAdapter.objects.filter(deployment=deployment).values_list(
            "adapter__served_name", flat=True
        )
    )
    found: dict[str, dict] = {}
    for replica in deployment.replicas.filter(active=True).order_by("base_url"):
        for name, root in loaded_adapters(replica).items():
            if name in managed:
                continue
            entry = found.setdefault(name, {"roots": set(), "replicas": []})
            entry["roots"].add(root)
            entry["replicas"].append(replica.base_url)
    return {
        name: {"roots": sorted(entry["roots"]), "replicas": entry["replicas"]}
        for name, entry in sorted(found.items())
    }


def readable_folder(deployment: Deployment, root: str) -> Path:
    """Where the control plane reads the folder a replica serves from `root`."""
    if not root or not os.path.isabs(root):
        raise ValidationFailed(
            f"The replicas report no absolute path for this adapter ({root!r}).",
            code="stray_path_unknown",
        )
    allowed: list[tuple[Path, Path]] = []
    if deployment.volume_serve_path and deployment.volume_write_path:
        allowed.append((Path(deployment.volume_serve_path), Path(deployment.volume_write_path)))
    allowed += [(Path(r), Path(r)) for r in settings.SERVING_ADOPTION_ROOTS]
    for served_root, local_root in allowed:
        try:
            relative = Path(os.path.normpath(root)).relative_to(os.path.normpath(served_root))
        except ValueError:
            continue
        local = (local_root / relative).resolve()
        if local.is_relative_to(local_root.resolve()) and local.is_dir():
            return local
    raise ValidationFailed(
        f"{root} is not a folder the control plane may read: adopt only adapters served "
        "from the deployment's adapter volume or from SERVING_ADOPTION_ROOTS.",
        code="stray_not_readable",
    )


def adoption_create(
    *, actor: Actor, deployment: Deployment, served_name: str, department: Department, name: str
) -> Adoption:
    require_platform_admin(actor)
    stray = strays_of(deployment).get(served_name)
    if stray is None:
        raise NotFound(
            f"No replica of {deployment.name} lists an unmanaged adapter {served_name!r}.",
            code="stray_not_found",
        )
    if len(stray["roots"]) != 1:
        raise Conflict(
            f"The replicas serve {served_name!r} from different paths ({stray['roots']}): "
            "adopt it once they agree.",
            code="stray_paths_differ",
        )
    root = stray["roots"][0]
    folder = readable_folder(deployment, root)
    # Before anything is written: the version would be promoted here on approval.
    refusal = department_refusal(deployment, Adapter(department=department))
    if refusal:
        raise NotAuthorized(refusal, code="department_not_allowed")
    adapter = Adapter.objects.filter(department=department, name=name).first()
    if adapter is None:
        adapter = adapter_create(
            actor=actor,
            department=department,
            name=name,
            base_model=deployment.base_model_name,
            served_name=served_name,
            description=f"Adopted from {deployment.name}, where it was already served.",
        )
    elif adapter.served_name != served_name:
        raise Conflict(
            f"Adapter {department.slug}/{name} is served as {adapter.served_name!r}, "
            f"not {served_name!r}.",
            code="served_name_differs",
        )
    result = version_register(
        actor=actor,
        adapter=adapter,
        source=LocalFolder(folder),
        lineage=Lineage(dataset=f"adopted from {deployment.name}"),
    )
    version = result.version
    report = evaluate_gate(deployment, version)
    if not report.passed:
        raise ValidationFailed(
            "The adapter does not pass the deployment's compatibility gate: "
            + "; ".join(check.message for check in report.failures),
            code="gate_failed",
            details={"gate_report": report.as_list(), "version": version.pk},
        )
    if version.status == VersionStatus.REGISTERED:
        version = version_transition(actor=actor, version=version, action="submit")
    try:
        with transaction.atomic():
            adoption = Adoption.objects.create(
                deployment=deployment,
                served_name=served_name,
                lora_path=root,
                adapter=adapter,
                version=version,
                status=AdoptionStatus.PENDING_APPROVAL,
                requested_by=actor.user,
            )
            audit_record(
                actor=actor,
                action="adoption.requested",
                obj=adoption,
                department=department,
                to_state=adoption.status,
                details={
                    "deployment": deployment.name,
                    "served_name": served_name,
                    "version": version.number,
                },  # fmt: skip
            )
    except IntegrityError:
        raise Conflict(
            f"{served_name!r} on {deployment.name} is already waiting for approval.",
            code="adoption_pending",
        ) from None
    if version.status == VersionStatus.APPROVED:
        adoption_settle(version=version)
        adoption.refresh_from_db()
    return adoption


def adoption_settle(*, version: AdapterVersion) -> None:
    """On a version's transition: an approved adoption is promoted to its
    deployment, as the person who asked for it (promotion approval and allowed
    departments apply; the rollout serves the registry's copy, never the stray's
    folder); a rejected one ends. Compare-and-swap on the pending status, so a
    transition seen twice settles once."""
    if version.status not in (VersionStatus.APPROVED, VersionStatus.REJECTED):
        return
    for adoption in Adoption.objects.filter(
        version=version, status=AdoptionStatus.PENDING_APPROVAL
    ).select_related("deployment", "adapter__department", "requested_by"):
        target = (
            AdoptionStatus.SERVED
            if version.status == VersionStatus.APPROVED
            else AdoptionStatus.REJECTED
        )
        details = {"deployment": adoption.deployment.name, "version": version.number}
        with transaction.atomic():
            moved = Adoption.objects.filter(
                pk=adoption.pk, status=AdoptionStatus.PENDING_APPROVAL
            ).update(status=target, finished_at=timezone.now())
            if not moved:
                continue
            if target == AdoptionStatus.SERVED:
                promoted = _promote(adoption, version)
                if isinstance(promoted, str):
                    # Refused now (the deployment's departments or capacity
                    # changed): the stray stays a stray, the version approved.
                    target = AdoptionStatus.REJECTED
                    Adoption.objects.filter(pk=adoption.pk).update(status=target)
                    details["refused"] = promoted
                else:
                    details.update(promotion=promoted.pk, promotion_status=promoted.status)
            audit_record(
                actor=None,
                action=f"adoption.{target}",
                obj=adoption,
                department=adoption.adapter.department,
                from_state=AdoptionStatus.PENDING_APPROVAL,
                to_state=target,
                details=details,
            )


def _promote(adoption: Adoption, version: AdapterVersion):
    """The adopted version promoted to the deployment: a Promotion, or why not."""
    try:
        with transaction.atomic():
            return promotion_create(
                actor=system_actor(adoption.requested_by),
                deployment=adoption.deployment,
                version=version,
                canary=False,
            )
    except ApplicationError as error:
        return str(error)
