"""Runs the reconcile now, in this process, for every deployment or the named ones:
desired (the database) against what each replica serves, repairing the difference.

After a restore (docs/operators/retention.md) this puts every served adapter back on
fresh replicas without waiting for beat; it takes the same claim as the workers, so
it never fights a running tick (a deployment someone else holds is reported skipped).
"""

from __future__ import annotations

import os
import socket

from django.core.management.base import BaseCommand, CommandError

from serving.models import Deployment
from serving.reconcile.tick import reconcile_deployment


class Command(BaseCommand):
    help = "Reconcile deployments now: load what the database says is served, everywhere."

    def add_arguments(self, parser):
        parser.add_argument("deployments", nargs="*", help="names; default: every deployment")

    def handle(self, *args, deployments: list[str], **options):
        rows = Deployment.objects.order_by("name")
        if deployments:
            rows = rows.filter(name__in=deployments)
            missing = sorted(set(deployments) - set(rows.values_list("name", flat=True)))
            if missing:
                raise CommandError(f"No deployment named {', '.join(missing)}.")
        worker = f"manage.py-reconcile@{socket.gethostname()}:{os.getpid()}"
        for deployment in rows:
            report = reconcile_deployment(deployment.pk, worker)
            if report.quarantined:
                self.stdout.write(
                    f"{deployment.name}: quarantined, nothing sent. {report.quarantined}"
                )
                continue
            if report.skipped:
                self.stdout.write(f"{deployment.name}: skipped (another worker holds it)")
                continue
            self.stdout.write(
                f"{deployment.name}: {report.replicas_up} replicas up, "
                f"{report.replicas_down} down, {report.in_sync} in sync, "
                f"{len(report.repairs)} repairs"
                + (f" ({'; '.join(report.repairs)})" if report.repairs else "")
            )
