"""What the audit chain says a deployment serves, and where.

A restored dump is rows that anyone holding the backup could have edited; the
audit chain up to a head shipped elsewhere is not (core/audit_chain.py). This
module derives, from chained events alone and only up to that head, each
deployment's replica discovery (static URLs, DNS name, Kubernetes Service) and,
per adapter, the version served, its files' digest and the path vLLM loads it
from, and lists where the rows differ. serving/services/restore.py holds a
deployment on those differences; `refusal` is what every caller that would
send the deployment's vLLM key checks first.

The facts, in the details of: `deployment.created`/`deployment.updated`
("discovery"), `rollout.succeeded` and `rollout.retire` ("served"), and the
snapshots `deployment.restore_attested`/`deployment.restore_acknowledged`
(both). Events written before these details existed name nothing, so such a
deployment differs until it is changed, attested or acknowledged once
(docs/operators/retention.md#restoring).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import Q

from core.errors import Conflict
from core.models import AuditEvent
from registry.ingest.staging import StagedFile, manifest_sha256
from registry.models import AdapterVersion
from serving.models import Deployment, ServedAdapter

# How the replicas are found: the vLLM key goes to whatever these name.
DISCOVERY_FIELDS = (
    "replica_urls",
    "replica_dns_name",
    "replica_port",
    "replica_scheme",
    "kubernetes_namespace",
    "kubernetes_label_selector",
    "kubernetes_service_name",
)
SNAPSHOT_ACTIONS = ("deployment.restore_attested", "deployment.restore_acknowledged")
DEPLOYMENT_ACTIONS = ("deployment.created", "deployment.updated", *SNAPSHOT_ACTIONS)
SERVED_ACTIONS = ("rollout.succeeded", "rollout.retire")


class RestoreQuarantined(Conflict):
    code = "restore_held"


def discovery_of(deployment: Deployment) -> dict:
    values = {name: getattr(deployment, name) for name in DISCOVERY_FIELDS}
    # As discovery reads them (serving.replica_rows.discover_urls).
    values["replica_urls"] = [str(url).rstrip("/") for url in values["replica_urls"] or []]
    return values


def version_digest(version: AdapterVersion) -> str:
    """The manifest digest of the files the row lists: what staging checks the
    store's bytes against, so a row whose files were edited digests otherwise."""
    try:
        files = [
            StagedFile(str(f["path"]), int(f["size"]), str(f["sha256"])) for f in version.files
        ]
    except (KeyError, TypeError, ValueError):
        return "unreadable"
    return manifest_sha256(files)


def served_fact(deployment_id: int, adapter_id: int, version: AdapterVersion | None, path: str):
    """The "served" detail of an event that changes what a deployment serves."""
    return {
        "deployment_id": deployment_id,
        "adapter_id": adapter_id,
        "version_id": version.pk if version else None,
        "version": version.number if version else None,
        "digest": version_digest(version) if version else "",
        "manifest_sha256": version.manifest_sha256 if version else "",
        "served_path": path if version else "",
    }


def snapshot_of(deployment: Deployment) -> dict:
    """Everything this module compares, as a chained snapshot records it."""
    rows = ServedAdapter.objects.filter(deployment=deployment).select_related("version")
    return {
        "discovery": discovery_of(deployment),
        "served": {
            str(row.adapter_id): served_fact(
                deployment.pk, row.adapter_id, row.version, row.served_path
            )
            for row in rows
        },
    }


@dataclass
class Chained:
    discovery: dict | None = None
    # adapter id -> its "served" fact
    served: dict[int, dict] = field(default_factory=dict)


def chained_serving(deployment_id: int, through: int) -> Chained:
    """The facts of chained events with ids up to `through`, in chain order."""
    events = (
        AuditEvent.objects.filter(pk__lte=through)
        .filter(
            Q(
                object_type="serving.deployment",
                object_id=str(deployment_id),
                action__in=DEPLOYMENT_ACTIONS,
            )
            | Q(action__in=SERVED_ACTIONS, details__served__deployment_id=deployment_id)
        )
        .order_by("pk")
        .values_list("action", "details")
    )
    chained = Chained()
    for action, details in events.iterator():
        details = details if isinstance(details, dict) else {}
        if action in SNAPSHOT_ACTIONS:
            chained.discovery = details.get("discovery")
            chained.served = {int(k): v for k, v in (details.get("served") or {}).items()}
        elif action in DEPLOYMENT_ACTIONS:
            if "discovery" in details:
                chained.discovery = details["discovery"]
        elif isinstance(details.get("served"), dict):
            fact = details["served"]
            chained.served[int(fact["adapter_id"])] = fact
    return chained


def differences(deployment: Deployment, through: int) -> list[str]:
    """Where the rows differ from the chain up to event `through`; one sentence each."""
    chained = chained_serving(deployment.pk, through)
    found = []
    current = discovery_of(deployment)
    if chained.discovery is None:
        found.append(
            "The audit chain names none of this deployment's replicas (it was created "
            "or last changed before replica URLs were chained)."
        )
    else:
        named = set(chained.discovery.get("replica_urls") or [])
        for url in current["replica_urls"]:
            if url not in named:
                found.append(
                    f"Replica URL {url} is not named by the audit chain"
                    + (f" (it names {', '.join(sorted(named))})." if named else ".")
                )
        for url in sorted(named - set(current["replica_urls"])):
            found.append(f"The audit chain names replica URL {url}, which is no longer listed.")
        for name in DISCOVERY_FIELDS[1:]:
            if current[name] != chained.discovery.get(name):
                found.append(
                    f"{name} is {current[name]!r}; the audit chain says "
                    f"{chained.discovery.get(name)!r}."
                )
    rows = ServedAdapter.objects.filter(deployment=deployment).select_related("adapter", "version")
    seen = set()
    for row in rows.order_by("adapter__served_name"):
        seen.add(row.adapter_id)
        name = row.adapter.served_name
        fact = chained.served.get(row.adapter_id) or {}
        chained_version = fact.get("version_id")
        if row.version_id != chained_version:
            said = f"version {fact.get('version')}" if chained_version else "nothing served"
            found.append(
                f"{name} is served as "
                + (f"version {row.version.number}" if row.version else "nothing (retired)")
                + f"; the audit chain says {said}."
            )
            continue
        if row.version is None:
            continue
        digest = version_digest(row.version)
        manifest = fact.get("manifest_sha256", fact.get("digest"))
        if digest != fact.get("digest"):
            found.append(
                f"{name} version {row.version.number}: its files digest to {digest[:16]}…, "
                f"the audit chain recorded {str(fact.get('digest'))[:16]}…."
            )
        elif row.version.manifest_sha256 != manifest:
            found.append(
                f"{name} version {row.version.number}: its manifest digest is "
                f"{row.version.manifest_sha256[:16]}…, the audit chain recorded "
                f"{str(manifest)[:16]}…."
            )
        if row.served_path != fact.get("served_path"):
            found.append(
                f"{name} is loaded from {row.served_path}; the audit chain says "
                f"{fact.get('served_path')}."
            )
    for adapter_id, fact in chained.served.items():
        if adapter_id not in seen and fact.get("version_id") is not None:
            found.append(
                f"The audit chain says adapter {adapter_id} serves version {fact.get('version')} "
                "here; the database has no record of it."
            )
    return found


def quarantine_reason(deployment: Deployment) -> str:
    """Why nothing may be sent to this deployment's replicas now ("": it may)."""
    if deployment.restore_basis is None:
        return ""
    why = " ".join(deployment.restore_differences or []) or "It has not been checked yet."
    return (
        f"{deployment.name} is quarantined after a restore: what it serves and where must match "
        f"the audit chain, or a platform admin acknowledge the difference "
        f"(manage.py serving_acknowledge_restore {deployment.name}). {why}"
    )


def require_not_quarantined(deployment: Deployment) -> None:
    why = quarantine_reason(deployment)
    if why:
        raise RestoreQuarantined(why, details={"differences": deployment.restore_differences})
