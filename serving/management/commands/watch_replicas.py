"""Runs the Kubernetes replica discovery: one EndpointSlice watch per
deployment that names a namespace and a label selector, for as long as the
process lives. Run exactly one (deploy/kustomize/base/watch-replicas.yaml);
two would only do the same writes twice.

    manage.py watch_replicas [--heartbeat-file /tmp/watch-heartbeat] [--seconds N]

Needs get, list and watch on endpointslices (discovery.k8s.io) in every
namespace the deployments name; credentials per KUBERNETES_AUTH.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections

from serving.discovery.kubernetes import WatchSupervisor, api_client


class Command(BaseCommand):
    help = "Watches EndpointSlices and keeps Kubernetes-discovered replicas current."

    def add_arguments(self, parser):
        parser.add_argument(
            "--heartbeat-file",
            default="",
            help="touched after every refresh while the watches make progress (liveness probe)",
        )
        parser.add_argument(
            "--seconds", type=float, default=0, help="stop after this long (0: run until killed)"
        )

    def handle(self, *args, heartbeat_file="", seconds=0, **options):
        try:
            client = api_client()
        except Exception as error:  # the client raises several types for bad config
            raise CommandError(
                f"No Kubernetes credentials ({settings.KUBERNETES_AUTH}): {error}"
            ) from None
        stop = threading.Event()
        # Put back when the loop ends: a caller in the same process (call_command
        # from a test or a script) keeps its own Ctrl-C and SIGTERM.
        earlier = {
            signum: signal.signal(signum, lambda *_: stop.set())
            for signum in (signal.SIGTERM, signal.SIGINT)
        }
        supervisor = WatchSupervisor(client)
        heartbeat = Path(heartbeat_file) if heartbeat_file else None
        started = time.monotonic()
        try:
            while not stop.is_set():
                supervisor.refresh()
                close_old_connections()
                if heartbeat and self._healthy(supervisor):
                    heartbeat.touch()
                if seconds and time.monotonic() - started >= seconds:
                    break
                stop.wait(settings.KUBERNETES_DEPLOYMENTS_REFRESH_SECONDS)
        finally:
            supervisor.stop()
            for signum, handler in earlier.items():
                signal.signal(signum, handler)
        self.stdout.write(f"watched {len(supervisor.last_targets)} deployment(s)")

    @staticmethod
    def _healthy(supervisor: WatchSupervisor) -> bool:
        # Alive means every watch heard from the API within two watch periods.
        horizon = time.time() - 2 * settings.KUBERNETES_WATCH_TIMEOUT_SECONDS - 60
        return all(
            watch.stats.last_progress > horizon for watch, _thread in supervisor.watches.values()
        )
