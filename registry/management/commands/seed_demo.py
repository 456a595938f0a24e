"""Demo data for `make run`: four departments, a member and an approver in each,
a platform admin (each with an email address, for the local mail outbox), one
adapter per department, and ready-to-upload adapter archives (versions 1 to 3).

Idempotent: running it again changes nothing that exists.
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from core.models import Department, Membership, Role
from registry.models import Adapter

DEPARTMENTS = {
    "finance": ("Finance", "invoices", "Reads invoices and extracts line items."),
    "legal": ("Legal", "contracts", "Summarises contract clauses."),
    "hr": ("HR", "policies", "Answers questions on HR policies."),
    "support": ("Support", "tickets", "Drafts first replies to support tickets."),
}
DEMO_PASSWORD = "demo-password"  # noqa: S105 - printed demo login, never production
BASE_MODEL = "tiny-llama"


def demo_email(username: str) -> str:
    """Where the demo's notifications go: `make run` keeps them in the local
    mail outbox (/notifications/outbox/), so no message leaves the machine."""
    return f"{username}@demo.example"


class Command(BaseCommand):
    help = "Creates demo departments, users, adapters and adapter archives (idempotent)."

    def add_arguments(self, parser):
        parser.add_argument("--adapters-dir", default=str(settings.VAR_DIR / "demo-adapters"))

    def handle(self, *args, **options):
        User = get_user_model()
        with transaction.atomic():
            admin, created = User.objects.get_or_create(
                username="admin",
                defaults={"is_staff": True, "is_superuser": True, "email": demo_email("admin")},
            )
            if created:
                admin.set_password(DEMO_PASSWORD)
                admin.save()
            for slug, (name, adapter_name, description) in DEPARTMENTS.items():
                department, _ = Department.objects.get_or_create(slug=slug, defaults={"name": name})
                for role in (Role.MEMBER, Role.APPROVER):
                    username = f"{slug}-{role}"
                    user, created = User.objects.get_or_create(
                        username=username, defaults={"email": demo_email(username)}
                    )
                    if created:
                        user.set_password(DEMO_PASSWORD)
                        user.save()
                    Membership.objects.get_or_create(
                        user=user, department=department, defaults={"role": role}
                    )
                adapter, created = Adapter.objects.get_or_create(
                    department=department,
                    name=adapter_name,
                    defaults={
                        "description": description,
                        "base_model": BASE_MODEL,
                        "served_name": f"{slug}-{adapter_name}",
                        "created_by": admin,
                    },
                )
                if created:
                    adapter.owners.add(User.objects.get(username=f"{slug}-member"))
        written = self._write_archives(Path(options["adapters_dir"]))
        self.stdout.write(self.style.SUCCESS("Demo data ready."))
        self.stdout.write(
            f"  logins (password '{DEMO_PASSWORD}'): admin, "
            + ", ".join(f"{slug}-member, {slug}-approver" for slug in DEPARTMENTS)
        )
        if written:
            self.stdout.write(f"  adapter archives to upload: {written}")

    def _write_archives(self, folder: Path) -> Path | None:
        try:
            from tests.support.adapters import AdapterSpec, adapter_tar_gz
        except ImportError:  # numpy/safetensors are dev dependencies
            return None
        folder.mkdir(parents=True, exist_ok=True)
        for index, (slug, (_, adapter_name, _)) in enumerate(DEPARTMENTS.items()):
            for version in (1, 2, 3):
                path = folder / f"{slug}-{adapter_name}-v{version}.tar.gz"
                if not path.exists():
                    spec = AdapterSpec(seed=100 * index + version, base_model=BASE_MODEL)
                    path.write_bytes(adapter_tar_gz(spec))
        return folder
