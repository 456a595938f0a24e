"""Checks the audit log's hash chain; exits non-zero at the first broken link.

Keep the printed head hash somewhere the database owner cannot write (a ticket,
another system's log): a chain rewritten from some point on verifies by
itself, but its head no longer matches the one kept outside.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from core.audit_chain import verify_chain


class Command(BaseCommand):
    help = "Verify the audit log's hash chain and print its head hash."

    def add_arguments(self, parser):
        parser.add_argument(
            "--expect-head",
            default="",
            help="A head hash kept elsewhere earlier; it must still be in the chain.",
        )

    def handle(self, *args, expect_head: str = "", **options):
        result = verify_chain()
        if not result.ok:
            raise CommandError(
                f"Audit chain broken at event {result.broken_at}: {result.reason}. "
                f"{result.checked} events before it verify."
            )
        if expect_head:
            from core.models import AuditEvent

            if not AuditEvent.objects.filter(hash=expect_head).exists():
                raise CommandError(
                    f"The chain verifies, but the head {expect_head} kept earlier is not in "
                    "it: the log was rewritten from some point before that head."
                )
        self.stdout.write(f"Audit chain intact: {result.checked} events, head {result.head}")
