"""Pushes every adapter version and deployment alias to the MLflow Model Registry.

Idempotent: MLflow versions are found by their registry tag and updated, never
duplicated. Safe to run from cron; exits non-zero when something failed.
"""

from django.core.management.base import BaseCommand, CommandError

from core.errors import ApplicationError
from mlflow_bridge.mirror import mirror_resync


class Command(BaseCommand):
    help = "Re-sync the MLflow mirror (registered models, versions, status tags, aliases)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--pending-only",
            action="store_true",
            help="Only rows not yet synced (pending or failed), instead of everything.",
        )

    def handle(self, *args, **options):
        try:
            counts = mirror_resync(
                only_unsynced=options["pending_only"], log=lambda line: self.stderr.write(line)
            )
        except ApplicationError as error:
            raise CommandError(error.message) from None
        self.stdout.write(
            f"MLflow mirror: {counts['synced']} synced, {counts['failed']} failed, "
            f"{counts['busy']} busy (held by a worker)."
        )
        if counts["failed"]:
            raise CommandError(f"{counts['failed']} mirror row(s) failed; see above.")
