"""Which MLflow experiments each department may register runs from.

MLflow has no departments: any member who can reach a run id could register
another department's weights (and read its params, metrics and tags through
the version). A platform admin allows experiments per department, audited,
like the S3 artifact sources; register_from_run answers "no such run" for a
run in any other experiment, so its existence is not confirmed either.
"""

from __future__ import annotations

from django.db import IntegrityError, transaction

from core.access import require_platform_admin
from core.actors import Actor
from core.audit import audit_record
from core.errors import Conflict, NotFound, ReferenceNotFound, ValidationFailed
from core.models import Department
from mlflow_bridge import client as mlc
from mlflow_bridge.models import AllowedExperiment


def experiment_allowed(department: Department, experiment_id: str) -> bool:
    return AllowedExperiment.objects.filter(
        department=department, experiment_id=str(experiment_id)
    ).exists()


def _resolve(experiment: str) -> tuple[str, str]:
    """(id, name) of the experiment named by id or by name, asked of MLflow."""
    experiment = (experiment or "").strip()
    if not experiment or len(experiment) > 500:
        raise ValidationFailed("Name an MLflow experiment by id or name.", code="bad_experiment")
    if not mlc.is_enabled():
        # Without a tracking server only an id can be recorded (it cannot be checked).
        if not experiment.isdigit():
            # A name nothing can resolve names nothing: not found, as for runs.
            raise ReferenceNotFound(
                "MLflow is not configured on this registry: an experiment can be named "
                "only by its id.",
                code="mlflow_not_configured",
            )
        return experiment, ""
    try:
        client = mlc.get_client()
        found = client.get_experiment(experiment) if experiment.isdigit() else None
        found = found or client.get_experiment_by_name(experiment)
    except Exception as error:  # mapped below: MLflow's errors are many
        mapped = mlc.translate(error)
        if isinstance(mapped, mlc.MlflowNotFound):
            found = None
        else:
            raise ValidationFailed(
                f"MLflow could not be asked about the experiment: {mapped.message}",
                code="mlflow_error",
            ) from None
    if found is None:
        raise NotFound(f"MLflow has no experiment {experiment!r}.", code="experiment_not_found")
    return str(found.experiment_id), found.name or ""


def allowed_experiment_create(
    *, actor: Actor, department: Department, experiment: str
) -> AllowedExperiment:
    require_platform_admin(actor)
    experiment_id, name = _resolve(experiment)
    try:
        with transaction.atomic():
            grant = AllowedExperiment.objects.create(
                department=department,
                experiment_id=experiment_id,
                experiment_name=name[:500],
                created_by=actor.user,
            )
            audit_record(
                actor=actor,
                action="mlflow_experiment.allowed",
                obj=grant,
                department=department,
                details={"experiment_id": experiment_id, "experiment_name": name},
            )
    except IntegrityError:
        raise Conflict(
            f"{department.slug} may already register from experiment {experiment_id}.",
            code="duplicate_experiment",
        ) from None
    return grant


def allowed_experiment_delete(*, actor: Actor, grant: AllowedExperiment) -> None:
    require_platform_admin(actor)
    with transaction.atomic():
        audit_record(
            actor=actor,
            action="mlflow_experiment.disallowed",
            obj=grant,
            department=grant.department,
            details={
                "experiment_id": grant.experiment_id,
                "experiment_name": grant.experiment_name,
            },
        )
        grant.delete()
