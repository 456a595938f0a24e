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
        parser.add_argument(
            "--unregistered",
            action="store_true",
            help="Print it for a deployment not registered yet (`make run` starts its "
            "replicas with the token before it registers them).",
        )

    def handle(self, *args, deployment, unregistered=False, **options):
        if not unregistered and not Deployment.objects.filter(name=deployment).exists():
            raise CommandError(f"No deployment {deployment!r}.")
        self.stdout.write(metering_token(deployment))
