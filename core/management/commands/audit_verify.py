"""Checks the audit log's hash chain; exits non-zero at the first broken link.

Keep the printed head hash somewhere the database owner cannot write (a ticket,
another system's log): a chain rewritten from some point on verifies by
itself, but its head no longer matches the one kept outside.

    manage.py audit_verify --export -            # one JSON line on stdout, for a log shipper
    manage.py audit_verify --export /ship/head.json

The export is written only when the chain verifies: {"head", "events",
"verified_at"}. Ship it to a store the database owner cannot write, and pass
an earlier head back with --expect-head.
"""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from core.audit_chain import verify_chain


class Command(BaseCommand):
    help = "Verify the audit log's hash chain and print its head hash."

    def add_arguments(self, parser):
        parser.add_argument(
            "--expect-head",
            default="",
            help="A head hash kept elsewhere earlier; it must still be in the chain.",
        )
        parser.add_argument(
            "--export",
            default="",
            metavar="FILE",
            help="Write the verified head as one JSON line to FILE ('-' for stdout alone).",
        )

    def handle(self, *args, expect_head: str = "", export: str = "", **options):
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
        if export:
            line = json.dumps(
                {
                    "head": result.head,
                    "events": result.checked,
                    "verified_at": timezone.now().isoformat(),
                }
            )
            if export == "-":
                # Nothing else on stdout: a shipper reads exactly one JSON line.
                self.stdout.write(line)
                return
            target = Path(export)
            partial = target.with_name(target.name + ".partial")
            partial.write_text(line + "\n")
            partial.replace(target)  # a reader never sees half a line
        self.stdout.write(f"Audit chain intact: {result.checked} events, head {result.head}")
