"""A platform admin accepts a deployment quarantined after a restore (docs/operators/retention.md).

    manage.py serving_acknowledge_restore granite-prod --as-user alice --comment "INC-42"

Without --yes it only lists why each deployment is quarantined. With it, each named
deployment serves again as its rows say, and the audit log records who
accepted which differences (`deployment.restore_acknowledged`), with a
snapshot of the replica URLs and versions that a later restore's check
compares against.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from core.actors import system_actor
from core.errors import ApplicationError
from serving.attestation import quarantine_reason
from serving.models import Deployment
from serving.services.restore import deployment_restore_acknowledge


class Command(BaseCommand):
    help = "Accept what deployments quarantined after a restore serve, and where (audited)."

    def add_arguments(self, parser):
        parser.add_argument("deployments", nargs="*", help="names; default: every quarantined one")
        parser.add_argument("--as-user", default="", help="the platform admin who accepts")
        parser.add_argument("--comment", default="", help="why (a ticket), kept in the audit")
        parser.add_argument("--yes", action="store_true", help="acknowledge; else only list")

    def handle(self, *args, deployments: list[str], as_user: str, comment: str, yes: bool, **_):
        rows = Deployment.objects.filter(restore_basis__isnull=False).order_by("name")
        if deployments:
            named = Deployment.objects.filter(name__in=deployments)
            known = set(named.values_list("name", flat=True))
            missing = sorted(set(deployments) - known)
            if missing:
                raise CommandError(f"No deployment named {', '.join(missing)}.")
            rows = rows.filter(name__in=deployments)
        held = list(rows)
        if not held:
            self.stdout.write("No deployment is quarantined after a restore.")
            return
        for deployment in held:
            self.stdout.write(quarantine_reason(deployment))
        if not yes:
            self.stdout.write("Nothing acknowledged: check the above, then run again with --yes.")
            return
        if not as_user:
            raise CommandError("Name the platform admin who accepts this: --as-user <username>.")
        user = get_user_model().objects.filter(username=as_user, is_active=True).first()
        if user is None:
            raise CommandError(f"No active user named {as_user!r}.")
        for deployment in held:
            try:
                deployment_restore_acknowledge(
                    actor=system_actor(user), deployment=deployment, comment=comment
                )
            except ApplicationError as error:
                raise CommandError(str(error)) from None
            self.stdout.write(f"{deployment.name}: acknowledged by {as_user}; serving again.")
