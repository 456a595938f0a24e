"""Makes a deployment's front door route as the database says, now (the
reconcile does it after every tick too). Before the deployment exists,
`--base-model` writes the configuration HAProxy starts with: the base model's
route, no replicas yet (503 until they are known).

    manage.py door_sync local-cpu --base-model tiny-llama
    manage.py door_sync local-cpu --print-command   # how to start its HAProxy

The gateway's own container holds no database credentials (config/roles.py):
there `--offline --base-model M` writes that first configuration unless one is
already on the door volume (the workers keep it current), and
`--print-command` reads nothing either.
"""

from __future__ import annotations

import shlex

from django.core.management.base import BaseCommand, CommandError

from serving.door.haproxy import HAProxyFrontDoor
from serving.door.routing import routing_table
from serving.door.services import door_sync, front_door_for
from serving.models import Deployment
from serving.replica_rows import replicas_sync


class Command(BaseCommand):
    help = "Syncs a deployment's front door (HAProxy) with the routing table."

    def add_arguments(self, parser):
        parser.add_argument("deployment")
        parser.add_argument("--base-model", default="", help="before the deployment exists")
        parser.add_argument("--print-command", action="store_true")
        parser.add_argument(
            "--offline",
            action="store_true",
            help="without the database: the base model's configuration, unless one is there",
        )

    def handle(self, *args, **options):
        name = options["deployment"]
        # The front door's place and command depend on the name alone (settings).
        door = front_door_for(Deployment(name=name))
        if door is None:
            raise CommandError(f"{name} has no front door: name it in SERVING_DOORS.")
        if not isinstance(door, HAProxyFrontDoor):
            raise CommandError(
                f"{name}'s doors pull their state: each runs `python -m serving.door.agent`."
            )
        if options["print_command"]:
            self.stdout.write(shlex.join(door.command_line()))
            return
        if options["offline"]:
            if not options["base_model"]:
                raise CommandError("--offline needs --base-model.")
            if door.config_path.exists():
                self.stdout.write(f"front door of {name}: configuration kept")
                return
            self._write_base(door, name, options["base_model"])
            return
        deployment = Deployment.objects.filter(name=name).first()
        if deployment is None:
            if not options["base_model"]:
                raise CommandError(f"No deployment {name}: pass --base-model to bootstrap.")
            self._write_base(door, name, options["base_model"])
            return
        replicas_sync(deployment)
        for change in door_sync(deployment):
            self.stdout.write(f"front door of {name}: {change}")

    def _write_base(self, door, name: str, base_model: str) -> None:
        table = routing_table(deployment=name, base_model=base_model, replicas=[], served=[])
        door.write(table)
        self.stdout.write(f"front door of {name}: configuration written")
