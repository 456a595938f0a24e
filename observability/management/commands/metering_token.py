from django.core.management.base import BaseCommand, CommandError

from observability.otlp import metering_token
from serving.models import Deployment


class Command(BaseCommand):
    help = (
        "Prints the token a deployment's replicas send to the OTLP receiver "
        "(OTEL_EXPORTER_OTLP_TRACES_HEADERS, or serve.sh's SERVE_OTLP_TOKEN)."
    )

    def add_arguments(self, parser):
        parser.add_argument("deployment")

    def handle(self, *args, deployment, **options):
        if not Deployment.objects.filter(name=deployment).exists():
            raise CommandError(f"No deployment {deployment!r}.")
        self.stdout.write(metering_token(deployment))
