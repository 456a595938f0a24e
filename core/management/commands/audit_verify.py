"""Checks the audit log's hash chain; exits non-zero at the first broken link.

Keep the printed head hash somewhere the database owner cannot write (a ticket,
another system's log): a chain rewritten from some point on verifies by
itself, but its head no longer matches the one kept outside.

    manage.py audit_verify --export -            # one JSON line on stdout, for a log shipper
    manage.py audit_verify --export /ship/head.json

The export is written only when the chain verifies: {"head", "events",
"verified_at"}. Ship it to a store the database owner cannot write, and pass
an earlier head back with --expect-head.

After a restore, `--expect-head <head> --restored` also tells the apps that the
rows came from a dump: serving then sends nothing to a deployment until what it
serves and where match the chain up to that head (docs/operators/retention.md).
"""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from core.audit_chain import verify_chain
from core.signals import audit_chain_restored


class Command(BaseCommand):
    help = "Verify the audit log's hash chain and print its head hash."

    def add_arguments(self, parser):
        parser.add_argument(
            "--expect-head",
            default="",
            help="A head hash kept elsewhere earlier; it must still be in the chain.",
        )
        parser.add_argument(
            "--restored",
            action="store_true",
            help="This database was just restored from a dump: distrust what the chain up "
            "to --expect-head does not vouch for (serving holds deployments until it does).",
        )
        parser.add_argument(
            "--export",
            default="",
            metavar="FILE",
            help="Write the verified head as one JSON line to FILE ('-' for stdout alone).",
        )

    def handle(
        self, *args, expect_head: str = "", export: str = "", restored: bool = False, **options
    ):
        if restored and not expect_head:
            raise CommandError(
                "--restored needs --expect-head: the head shipped before the backup."
            )
        result = verify_chain()
        if not result.ok:
            raise CommandError(
                f"Audit chain broken at event {result.broken_at}: {result.reason}. "
                f"{result.checked} events before it verify."
            )
        if expect_head:
            from core.models import AuditEvent

            head_event_id = (
                AuditEvent.objects.filter(hash=expect_head).values_list("pk", flat=True).first()
            )
            if head_event_id is None:
                raise CommandError(
                    f"The chain verifies, but the head {expect_head} kept earlier is not in "
                    "it: the log was rewritten from some point before that head."
                )
            if restored:
                # Events after the shipped head came with the dump too: only the
                # chain up to it vouches for anything.
                for _receiver, lines in audit_chain_restored.send(
                    sender=self.__class__, head_event_id=head_event_id
                ):
                    for line in lines or []:
                        self.stdout.write(line)
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
