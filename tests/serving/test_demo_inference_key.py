"""`manage.py demo_inference_key` (make run's key): printed, kept in a file
only its owner reads, the same one on every run while it lives, a new one (the
old revoked) once it does not."""

from __future__ import annotations

import stat
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from serving.door.selectors import door_access
from serving.models import InferenceKey
from serving.services.inference_keys import hash_inference_key
from tests.serving.conftest import make_deployment

pytestmark = pytest.mark.django_db


def _run(path, *args) -> str:
    out = StringIO()
    call_command("demo_inference_key", "--file", str(path), *args, stdout=out)
    return out.getvalue().strip()


def test_it_prints_the_same_live_key_on_every_run_from_a_private_file(root, legal, tmp_path):
    path = tmp_path / "var" / "demo-inference-key"

    first = _run(path)
    second = _run(path)

    assert first == second and first.startswith("lsk_")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().strip() == first
    key = InferenceKey.objects.get()
    assert (key.department, key.created_by, key.secret_sha256) == (
        legal,
        root,
        hash_inference_key(first),
    )
    deployment = make_deployment(root, ["http://127.0.0.1:9/"], tmp_path / "volume")
    assert door_access(deployment).keys[hash_inference_key(first)].department == "legal"


def test_a_revoked_demo_key_is_replaced_and_a_loose_file_made_private(root, legal, tmp_path):
    path = tmp_path / "demo-inference-key"
    first = _run(path)
    InferenceKey.objects.update(revoked_at="2026-01-01T00:00:00Z")
    path.chmod(0o644)

    second = _run(path)

    assert second != first
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert InferenceKey.objects.filter(revoked_at__isnull=True).get().secret_sha256 == (
        hash_inference_key(second)
    )


def test_a_file_with_a_key_not_issued_as_the_demo_key_is_not_trusted(root, legal, alex, tmp_path):
    from serving.services.inference_keys import inference_key_issue
    from tests.conftest import actor

    _, other = inference_key_issue(actor=actor(alex), department=legal, name="x", expires_in_days=3)
    path = tmp_path / "demo-inference-key"
    path.write_text(other)

    assert _run(path) != other
    assert InferenceKey.objects.filter(revoked_at__isnull=True).count() == 2


def test_it_needs_the_demo_department(root, tmp_path):
    with pytest.raises(CommandError, match="seed_demo"):
        _run(tmp_path / "k", "--department", "nowhere")
