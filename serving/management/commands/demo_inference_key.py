"""`make run`'s inference key: one department key for the demo department, its
secret kept in a file only its owner reads (mode 600), and printed.

Idempotent: while the key in the file is live it is printed again; otherwise
(no file, revoked, expired) the demo keys before it are revoked and a new one
is issued, audited as a platform admin. For a laptop: production keys are
issued on the Keys pages or the API and never written anywhere.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from core.actors import Actor
from core.models import Department
from serving.door.selectors import live_inference_keys
from serving.models import InferenceKey
from serving.services.inference_keys import (
    hash_inference_key,
    inference_key_issue,
    inference_key_revoke,
)

NAME = "demo (make run)"


class Command(BaseCommand):
    help = "Prints the demo department's inference key, issuing one if none is live."

    def add_arguments(self, parser):
        parser.add_argument("--department", default="legal")
        parser.add_argument("--file", default=str(settings.VAR_DIR / "demo-inference-key"))
        parser.add_argument("--days", type=int, default=30)

    def handle(self, *args, department: str, file: str, days: int, **options):
        path = Path(file)
        secret = self._kept(path)
        if secret is None:
            secret = self._issue(department, days)
            _write_private(path, secret)
        self.stdout.write(secret)

    def _kept(self, path: Path) -> str | None:
        try:
            secret = path.read_text().strip()
        except FileNotFoundError:
            return None
        live = live_inference_keys().filter(secret_sha256=hash_inference_key(secret), name=NAME)
        return secret if secret and live.exists() else None

    def _issue(self, slug: str, days: int) -> str:
        department = Department.objects.filter(slug=slug).first()
        if department is None:
            raise CommandError(f"No department {slug!r} (run seed_demo first).")
        admin = (
            get_user_model().objects.filter(is_active=True, is_staff=True).order_by("pk").first()
        )
        if admin is None:
            raise CommandError("No platform admin (a staff user) to issue the key as.")
        actor = Actor(user=admin, request_id="demo_inference_key")
        with transaction.atomic():
            for old in InferenceKey.objects.filter(
                department=department, name=NAME, revoked_at__isnull=True
            ):
                inference_key_revoke(actor=actor, key=old, reason="replaced by a new demo key")
            _, secret = inference_key_issue(
                actor=actor, department=department, name=NAME, expires_in_days=days
            )
        return secret


def _write_private(path: Path, secret: str) -> None:
    """Readable by its owner only, from the first byte on."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)  # a file that was there keeps its mode otherwise
    with os.fdopen(descriptor, "w") as handle:
        handle.write(secret + "\n")
