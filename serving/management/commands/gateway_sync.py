"""The old name of door_sync: deploy manifests and scripts written before the
rename call it. It runs door_sync and says so on stderr."""

from __future__ import annotations

from serving.management.commands.door_sync import Command as DoorSync


class Command(DoorSync):
    help = "Renamed door_sync; this name still works."

    def handle(self, *args, **options):
        self.stderr.write("gateway_sync is renamed door_sync: call door_sync instead.")
        return super().handle(*args, **options)
