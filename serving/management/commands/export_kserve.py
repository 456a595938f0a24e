"""Prints a deployment's KServe ServingRuntime and InferenceService (YAML),
with every promoted adapter in --lora-modules:

    manage.py export_kserve granite-8b | kubectl apply -f -
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from core.errors import ApplicationError
from serving.kserve import render_yaml
from serving.models import Deployment


class Command(BaseCommand):
    help = "Prints the KServe manifests of one deployment with its promoted adapters."

    def add_arguments(self, parser):
        parser.add_argument("name", help="the deployment's name")

    def handle(self, *args, name, **options):
        deployment = Deployment.objects.filter(name=name).first()
        if deployment is None:
            raise CommandError(f"No deployment named {name!r}.")
        try:
            self.stdout.write(render_yaml(deployment), ending="")
        except ApplicationError as error:
            raise CommandError(error.message) from None
