"""The adapter volume: immutable versioned folders, checksums, and deletion
only after the grace period once nothing serves them."""

from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from serving.models import StagedFolder
from serving.rollouts.engine import rollout_execute
from serving.services.promotions import promotion_create, retire
from serving.volume import StagingError, collect_garbage, relative_path, stage_version
from tests.conftest import actor

pytestmark = pytest.mark.django_db


def serve(user, deployment, version):
    promotion = promotion_create(actor=actor(user), deployment=deployment, version=version)
    assert rollout_execute(promotion.rollouts.get().pk, "w") == "succeeded"


def test_staging_is_idempotent_and_read_only(deployment, approved_v1):
    first = stage_version(deployment, approved_v1)
    again = stage_version(deployment, approved_v1)
    assert first.pk == again.pk
    folder = Path(first.write_path)
    assert folder.name == f"v1-{approved_v1.sha8}"
    assert relative_path(approved_v1) == f"legal/contracts/v1-{approved_v1.sha8}"
    assert all(not (p.stat().st_mode & 0o222) for p in folder.iterdir())
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".staging-")]


def test_a_path_is_never_reused_for_other_bytes(deployment, approved_v1):
    folder = Path(stage_version(deployment, approved_v1).write_path)
    weights = folder / "adapter_model.safetensors"
    weights.chmod(0o644)
    weights.write_bytes(b"tampered")
    with pytest.raises(StagingError, match="does not match"):
        stage_version(deployment, approved_v1)


def test_a_corrupt_stored_artifact_is_refused(deployment, approved_v1):
    from registry.artifact_store import get_artifact_store

    store = get_artifact_store()
    key = f"{approved_v1.storage_prefix}/adapter_config.json"
    path = Path(store.uri(key).removeprefix("file://"))
    path.chmod(0o644)
    path.write_text("{}")
    with pytest.raises(StagingError, match="sha256"):
        stage_version(deployment, approved_v1)
    assert not Path(deployment.volume_write_path, relative_path(approved_v1)).exists()


def test_old_folders_go_only_after_the_grace_period(
    settings, lena, deployment, approved_v1, approved_v2
):
    settings.SERVING_STAGED_GRACE_SECONDS = 3600
    serve(lena, deployment, approved_v1)
    serve(lena, deployment, approved_v2)
    old = StagedFolder.objects.get(version=approved_v1)
    current = StagedFolder.objects.get(version=approved_v2)
    assert old.unreferenced_since is not None and current.unreferenced_since is None

    assert collect_garbage() == []  # within the grace period vLLM may still re-read it
    assert Path(old.write_path).is_dir()

    later = timezone.now() + timedelta(hours=2)
    assert collect_garbage(now=later) == [old.write_path]
    assert not Path(old.write_path).exists()
    assert Path(current.write_path).is_dir()


def test_a_folder_served_again_is_kept(settings, lena, deployment, approved_v1, approved_v2):
    from serving.services.promotions import rollback_to

    serve(lena, deployment, approved_v1)
    serve(lena, deployment, approved_v2)
    back = rollback_to(actor=actor(lena), deployment=deployment, adapter=approved_v1.adapter)
    rollout_execute(back.pk, "w")

    later = timezone.now() + timedelta(days=3)
    deleted = collect_garbage(now=later)
    assert StagedFolder.objects.get(version=approved_v1).write_path not in deleted
    assert Path(StagedFolder.objects.get(version=approved_v1).write_path).is_dir()


def test_retired_adapters_folders_are_collected_after_the_grace(lena, deployment, approved_v1):
    serve(lena, deployment, approved_v1)
    gone = retire(actor=actor(lena), deployment=deployment, adapter=approved_v1.adapter)
    rollout_execute(gone.pk, "w")
    folder = StagedFolder.objects.get(version=approved_v1)
    assert folder.unreferenced_since is not None
    collect_garbage(now=timezone.now() + timedelta(days=2))
    folder.refresh_from_db()
    assert folder.deleted_at is not None and not Path(folder.write_path).exists()


def test_a_folder_a_rendered_manifest_names_is_kept_while_that_manifest_may_be_applied(
    settings, lena, root, deployment, approved_v1, approved_v2
):
    """A pod started from a KServe export reads the folders in its --lora-modules,
    whatever the control plane serves by then."""
    from serving.services.manifests import kserve_export

    settings.SERVING_STAGED_GRACE_SECONDS = 0
    settings.SERVING_MANIFEST_PIN_DAYS = 30
    from serving.models import Deployment

    Deployment.objects.filter(pk=deployment.pk).update(base_model_pvc="models", adapter_pvc="lora")
    deployment.refresh_from_db()
    serve(lena, deployment, approved_v1)
    kserve_export(actor=actor(root), deployment=deployment)  # names v1
    serve(lena, deployment, approved_v2)
    v1_folder = StagedFolder.objects.get(version=approved_v1)
    later = timezone.now() + timedelta(hours=1)

    assert collect_garbage(now=later) == []  # the latest manifest names v1
    assert Path(v1_folder.write_path).is_dir()

    kserve_export(actor=actor(root), deployment=deployment)  # now names v2 only
    StagedFolder.objects.filter(pk=v1_folder.pk).update(unreferenced_since=timezone.now())
    assert collect_garbage(now=later) == []  # the older manifest is within its 30 days
    assert collect_garbage(now=timezone.now() + timedelta(days=31)) == [v1_folder.write_path]
    assert not Path(v1_folder.write_path).exists()
    assert Path(StagedFolder.objects.get(version=approved_v2).write_path).is_dir()


def test_a_rollout_under_way_keeps_the_folder_it_would_roll_back_to(
    settings, lena, deployment, approved_v1, approved_v2
):
    settings.SERVING_STAGED_GRACE_SECONDS = 0
    from serving.models import Rollout, ServedAdapter

    serve(lena, deployment, approved_v1)
    promotion = promotion_create(actor=actor(lena), deployment=deployment, version=approved_v2)
    # Mid-swap, as a worker that died while loading leaves it: v1 no longer recorded as
    # served, the rollout (for the sweeper to resume) names v1 as its way back.
    Rollout.objects.filter(pk=promotion.rollouts.get().pk).update(
        status="loading", previous_version=approved_v1
    )
    ServedAdapter.objects.filter(deployment=deployment).update(version=None)
    StagedFolder.objects.filter(version=approved_v1).update(unreferenced_since=timezone.now())
    assert collect_garbage(now=timezone.now() + timedelta(days=2)) == []
    assert Path(StagedFolder.objects.get(version=approved_v1).write_path).is_dir()
