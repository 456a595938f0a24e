"""The KServe export as a write: rendering it records which versions it names
(ManifestRender), because a pod started from that YAML reads their staged folders
long after the download. The volume GC keeps them (serving/volume.py)."""

from __future__ import annotations

from core.actors import Actor
from serving import kserve, selectors
from serving.models import Deployment, ManifestRender


def kserve_export(*, actor: Actor, deployment: Deployment) -> str:
    """The manifests' YAML for someone allowed to see them (selectors.kserve_manifests)."""
    text = selectors.kserve_manifests(actor, deployment)
    ManifestRender.objects.create(
        deployment=deployment,
        version_ids=sorted(s.version_id for s in kserve.promoted(deployment)),
        rendered_by=actor.user,
    )
    return text
