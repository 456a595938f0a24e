"""Prints (or writes to a file, mode 0600) the token the doors of a deployment
whose doors pull their state send to the control plane (DOOR_TOKEN_FILE of
serving/door/agent.py). It reads that deployment's door state, nothing else;
it changes with the secret key (the previous key's token works while it is
among DJANGO_SECRET_KEY_FALLBACKS).

    manage.py door_credential prod                   # prints it
    manage.py door_credential prod --write /run/door-token
"""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from serving.api.doors import door_token
from serving.door.fleet import PULL


class Command(BaseCommand):
    help = "Prints or writes the token of a deployment's door agents."

    def add_arguments(self, parser):
        parser.add_argument("deployment")
        parser.add_argument("--write", default="", help="a file to write it to (0600), not stdout")

    def handle(self, *args, deployment, write="", **options):
        if settings.SERVING_DOORS.get(deployment) != PULL:
            raise CommandError(
                f"{deployment}'s doors do not pull their state (SERVING_DOORS={deployment}=pull)."
            )
        token = door_token(deployment)
        if not write:
            self.stdout.write(token)
            return
        path = Path(write)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(token + "\n")
        self.stdout.write(f"door token of {deployment} written to {path}")
