"""Prints a deployment's Kuadrant policies (YAML): an AuthPolicy for its
inference keys and grants, and the RateLimitPolicy and TokenRateLimitPolicy of
its limits, attached to the deployment's HTTPRoute:

    manage.py export_kuadrant granite-8b --route granite-8b | kubectl apply -f -

API keys are Secrets Authorino selects by label; no key is printed
(docs/door.md, "Kubernetes: Kuadrant").
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from serving.door.kuadrant import render_yaml
from serving.models import Deployment


class Command(BaseCommand):
    help = "Prints the Kuadrant policies of one deployment's keys, grants and limits."

    def add_arguments(self, parser):
        parser.add_argument("name", help="the deployment's name")
        parser.add_argument(
            "--route", default="", help="the HTTPRoute the policies attach to (default: the name)"
        )

    def handle(self, *args, name, route, **options):
        deployment = Deployment.objects.filter(name=name).first()
        if deployment is None:
            raise CommandError(f"No deployment named {name!r}.")
        self.stdout.write(render_yaml(deployment, route=route or None), ending="")
