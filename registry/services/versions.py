"""Registering adapter versions and moving them through their lifecycle."""

from __future__ import annotations

import logging
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from core.access import require_approver, require_contributor, require_four_eyes
from core.actors import Actor
from core.audit import audit_record
from core.errors import (
    Conflict,
    ValidationFailed,
)
from core.models import Ability
from core.state import move
from registry import signals
from registry.artifact_store import discard_stored, get_artifact_store, store_unavailable
from registry.ingest.adapter_validation import AdapterMetadata, inspect_adapter
from registry.ingest.errors import ArtifactRejected
from registry.ingest.incoming import IncomingArtifact, S3Prefix
from registry.ingest.staging import IngestLimits, StagedArtifact
from registry.models import Adapter, AdapterVersion, IdempotencyClaim
from registry.services.idempotency import idempotency_complete, require_valid_key
from registry.source_policy import s3_options_for, source_for_s3_uri
from registry.storage import StorageError
from registry.transitions import TRANSITIONS, VERSION_TRANSITIONS, allowed_actions_from

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Lineage:
    mlflow_run_id: str = ""
    mlflow_run_uri: str = ""
    source_commit: str = ""
    dataset: str = ""


@dataclass
class RegistrationResult:
    version: AdapterVersion
    created: bool
    warnings: list[str] = field(default_factory=list)


def ingest_limits() -> IngestLimits:
    return IngestLimits(
        max_total_bytes=settings.INGEST_MAX_BYTES,
        max_file_bytes=settings.INGEST_MAX_BYTES,
        max_entries=settings.INGEST_MAX_ENTRIES,
    )


def _existing_for_retry(
    adapter: Adapter, idempotency_key: str | None, lineage: Lineage
) -> AdapterVersion | None:
    if idempotency_key:
        found = adapter.versions.filter(idempotency_key=idempotency_key).first()
        if found:
            return found
    if lineage.mlflow_run_id:
        return adapter.versions.filter(mlflow_run_id=lineage.mlflow_run_id).first()
    return None


def version_prefix(adapter: Adapter) -> str:
    """Where a new version's files go in the artifact store."""
    return f"adapters/{adapter.department.slug}/{adapter.name}/{uuid.uuid4().hex}"


def version_register(
    *,
    actor: Actor,
    adapter: Adapter,
    source: IncomingArtifact | None,
    idempotency_key: str | None = None,
    idempotency_claim: IdempotencyClaim | None = None,
    lineage: Lineage = Lineage(),
) -> RegistrationResult:
    """Validates an untrusted artifact, stores it, and records version N+1.

    `source` is one of registry.ingest.incoming (None: the request named no
    artifact, refused with `no_artifact` unless it replays an earlier one).
    Nothing is kept unless everything succeeds: the staging folder is always
    removed, and stored objects are deleted if the row cannot be written. A
    source whose files are already in the store (a streamed upload) has them
    deleted unless a new version records them.
    """
    key = (idempotency_key, idempotency_claim)
    if source is None:
        return _register(actor, adapter, None, key, lineage)
    try:
        result = _register(actor, adapter, source, key, lineage)
    except BaseException:
        source.discard()
        raise
    finally:
        source.close()
    if not result.created:
        source.discard()  # a replay: the earlier version's files are the ones kept
    return result


def _register(actor, adapter, source, key, lineage) -> RegistrationResult:
    idempotency_key, claim = key
    require_contributor(actor, adapter.department_id, Ability.REGISTER_VERSIONS, "Adapter")
    if idempotency_key is not None:
        require_valid_key(idempotency_key)
    if isinstance(source, S3Prefix):
        # Before anything is read: the server fetches with its own network
        # position, so only a prefix a platform admin allowed this department
        # may be read, with that source's credentials.
        source.client_options = s3_options_for(source_for_s3_uri(adapter.department, source.uri))
    existing = _existing_for_retry(adapter, idempotency_key, lineage)
    if existing:
        return RegistrationResult(version=existing, created=False)
    if source is None:
        raise ValidationFailed(
            "Give the artifact exactly one way: uploaded files, or s3_uri.",
            code="no_artifact",
        )

    staging_root = Path(settings.INGEST_STAGING_DIR)
    staging_root.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="ingest-", dir=staging_root))
    try:
        try:
            staged = source.stage(workdir, ingest_limits())
        except ArtifactRejected as rejection:
            raise _rejected(rejection) from rejection
        metadata = _inspect(staged)
        duplicate = adapter.versions.filter(manifest_sha256=staged.manifest_sha256).first()
        if duplicate:
            raise Conflict(
                f"This artifact is identical to version {duplicate.number} of {adapter}.",
                code="duplicate_artifact",
                details={"duplicate_of": duplicate.number},
            )
        prefix = source.stored_prefix
        if prefix is None:
            prefix = version_prefix(adapter)
            _store(staged, prefix)
        try:
            version = _record_version(
                actor,
                adapter,
                staged,
                metadata,
                prefix,
                key,
                lineage,
                source.source_uri,
            )
        except _Replayed as replay:
            discard_stored(get_artifact_store(), prefix)
            return RegistrationResult(version=replay.version, created=False)
        except BaseException:
            discard_stored(get_artifact_store(), prefix)
            raise
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return RegistrationResult(version=version, created=True, warnings=_warnings(adapter, metadata))


def _inspect(staged: StagedArtifact) -> AdapterMetadata:
    try:
        return inspect_adapter(
            staged.root,
            serving_dtype=settings.SERVING_DTYPE,
            allow_pickle=settings.INGEST_ALLOW_PICKLE,
            # Fed by staging or by the streamed upload on their one pass over the bytes.
            tensor_values=staged.tensor_values,
        )
    except ArtifactRejected as rejection:
        raise _rejected(rejection) from rejection


def _rejected(rejection: ArtifactRejected) -> ValidationFailed:
    error = ValidationFailed(rejection.message, code=rejection.code)
    # Keep the library's 413 (size limits) and 415 (unsupported type).
    error.status = rejection.status
    return error


def _store(staged: StagedArtifact, prefix: str) -> None:
    store = get_artifact_store()
    try:
        for item in staged.files:
            store.put_file(f"{prefix}/{item.path}", staged.root / item.path, sha256=item.sha256)
    except StorageError as error:
        discard_stored(store, prefix)
        raise store_unavailable(error) from None
    except BaseException:
        discard_stored(store, prefix)
        raise


def _record_version(
    actor, adapter, staged, metadata, prefix, key, lineage, source_uri
) -> AdapterVersion:
    idempotency_key, claim = key
    try:
        with transaction.atomic():
            # The adapter row lock serialises numbering: concurrent registrations
            # get N+1 and N+2, never the same number and never a gap.
            locked = Adapter.objects.select_for_update(no_key=True).get(pk=adapter.pk)
            # Re-checked under the lock: the MLflow run id has no unique constraint.
            replay = _existing_for_retry(adapter, idempotency_key, lineage)
            if replay is not None:
                raise _Replayed(replay)
            locked.last_version_number += 1
            locked.save(update_fields=["last_version_number", "updated_at"])
            version = AdapterVersion.objects.create(
                adapter=locked,
                number=locked.last_version_number,
                artifact_uri=get_artifact_store().uri(prefix) + "/",
                storage_prefix=prefix,
                files=[{"path": f.path, "size": f.size, "sha256": f.sha256} for f in staged.files],
                manifest_sha256=staged.manifest_sha256,
                total_size=staged.total_size,
                peft_type=metadata.peft_type,
                r=metadata.r,
                lora_alpha=metadata.lora_alpha,
                target_modules=list(metadata.target_modules),
                base_model_name_or_path=metadata.base_model_name_or_path or "",
                tensor_count=metadata.tensor_count,
                parameter_count=metadata.parameter_count,
                dtype=metadata.dtype,
                serving_dtype=settings.SERVING_DTYPE,
                estimated_memory_bytes=metadata.estimated_memory_bytes,
                layer_count=metadata.layer_count,
                module_shapes=[
                    {
                        "module": m.module,
                        "in_features": m.in_features,
                        "out_features": m.out_features,
                        "rank": m.rank,
                    }
                    for m in metadata.module_shapes
                ],
                rank_pattern=metadata.rank_pattern or {},
                adapter_config=metadata.config,
                registered_by=actor.user,
                registered_via_token=actor.token,
                author_ids=sorted(actor.people),
                idempotency_key=idempotency_key,
                source_uri=source_uri,
                mlflow_run_id=lineage.mlflow_run_id,
                mlflow_run_uri=lineage.mlflow_run_uri,
                source_commit=lineage.source_commit,
                dataset=lineage.dataset,
            )
            if claim is not None:
                # Committed with the version: waiting retries see both or neither.
                idempotency_complete(claim=claim, version=version)
            audit_record(
                actor=actor,
                action="version.registered",
                obj=version,
                department=adapter.department,
                to_state=version.status,
                details={
                    "manifest_sha256": staged.manifest_sha256,
                    "total_size": staged.total_size,
                },
            )
            signals.version_registered.send(sender=AdapterVersion, version=version)
    except IntegrityError:
        # Lost a race. A retry with the same idempotency key or MLflow run gets
        # the winner's result, as it would had it arrived a moment later.
        replay = _existing_for_retry(adapter, idempotency_key, lineage)
        if replay is not None:
            raise _Replayed(replay) from None
        winner = adapter.versions.filter(manifest_sha256=staged.manifest_sha256).first()
        raise Conflict(
            "An identical version was registered at the same moment"
            + (f": version {winner.number}." if winner else "."),
            code="duplicate_artifact",
        ) from None
    return version


class _Replayed(Exception):
    def __init__(self, version: AdapterVersion):
        super().__init__(version.pk)
        self.version = version


def _warnings(adapter: Adapter, metadata: AdapterMetadata) -> list[str]:
    warnings = []
    if metadata.base_model_name_or_path and metadata.base_model_name_or_path != adapter.base_model:
        warnings.append(
            f"The artifact says base_model_name_or_path={metadata.base_model_name_or_path!r}, "
            f"but the adapter targets {adapter.base_model!r}."
        )
    return warnings


def version_transition(
    *, actor: Actor, version: AdapterVersion, action: str, comment: str = ""
) -> AdapterVersion:
    """Applies one row of the transition table, under a row lock, with its audit event.

    Two approvers acting at once: the second waits for the lock, then sees the
    new status and gets a 409, so exactly one transition happens.
    """
    transition = TRANSITIONS.get(action)
    if transition is None:
        raise ValidationFailed(f"Unknown action {action!r}.", code="unknown_action")
    department_id = version.adapter.department_id
    if transition.who == "contributor":
        require_contributor(actor, department_id, Ability.SUBMIT_FOR_REVIEW, "Version")
    else:
        require_approver(actor, department_id, "Version")
    comment = (comment or "").strip()
    if transition.comment_required and not comment:
        raise ValidationFailed(f"A comment is required to {action}.", code="comment_required")

    with transaction.atomic():
        locked = AdapterVersion.objects.select_for_update(no_key=True).get(pk=version.pk)
        if locked.status not in transition.sources:
            allowed = allowed_actions_from(locked.status) or ["none"]
            raise Conflict(
                f"Cannot {action} version {locked.number}: it is {locked.status}. "
                f"Allowed from {locked.status}: {', '.join(allowed)}.",
                code="invalid_transition",
                details={"current_status": locked.status},
            )
        if transition.who == "reviewer":
            require_version_four_eyes(actor, locked)
        previous = locked.status
        changes: dict[str, Any] = {"updated_at": timezone.now()}
        if action == "submit":
            changes["submitted_by"] = actor.user
            changes["author_ids"] = sorted(set(locked.author_ids) | actor.people)
        if transition.who == "reviewer":
            changes.update(
                reviewed_by=actor.user, reviewed_at=timezone.now(), review_comment=comment
            )
        # Under the row lock the compare-and-swap cannot lose; it is the one way
        # every state machine moves (core.state).
        if not move(locked, VERSION_TRANSITIONS, transition.target, **changes):
            raise Conflict(
                f"Version {locked.number} changed while it was being moved; look again.",
                code="concurrent_change",
            )
        audit_record(
            actor=actor,
            action=f"version.{action}",
            obj=locked,
            department=locked.adapter.department,
            from_state=previous,
            to_state=locked.status,
            comment=comment,
        )
        _after_transition(locked, previous)
    return locked


FOUR_EYES_VERSION = (
    "Four-eyes rule: you cannot review a version you registered or submitted, "
    "nor one registered or submitted through a token you minted or a service account "
    "you created."
)


def require_version_four_eyes(actor: Actor, version: AdapterVersion) -> None:
    require_four_eyes(actor, version.authors, FOUR_EYES_VERSION)


def _after_transition(version: AdapterVersion, previous: str) -> None:
    """Other apps react here (serving retires deprecated versions)."""
    signals.version_transitioned.send(sender=AdapterVersion, version=version, previous=previous)
