"""Registers running vLLM replicas as a deployment (create or update, idempotent).

`make run` uses it for the demo deployment "local-cpu"; it works for any vLLM
whose adapter folder this machine can write:

    manage.py register_local_deployment --url http://127.0.0.1:8100 \
        --base-model-path var/models/tiny-llama

The base model's identity (architecture, shapes) comes from a config.json:
--base-model-path, else the base model's `root` as GET /v1/models reports it,
if that folder is readable here. Without one, the deployment is recorded by
name only and the compatibility gate refuses every promotion until its
identity is entered (it cannot check target modules or shapes). max_loras is
read from the server's /metrics (the max_lora label) unless --max-loras is given.
"""

from __future__ import annotations

import sys
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from core.actors import system_actor
from core.errors import ApplicationError
from serving.fact_readings import max_lora_from_metrics
from serving.models import Deployment
from serving.services.deployments import deployment_create, deployment_update
from serving.vllm_client import VLLMClient, model_cards


class Command(BaseCommand):
    help = "Creates or updates a deployment for one running vLLM server (idempotent)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--url",
            required=True,
            action="append",
            help="a vLLM server, e.g. http://127.0.0.1:8100; repeat it for every replica",
        )
        parser.add_argument("--name", default="local-cpu")
        parser.add_argument("--environment", default="local")
        parser.add_argument(
            "--base-model-path", default="", help="folder with the base model's config.json"
        )
        parser.add_argument(
            "--base-model-name", default="", help="served name (default: read from /v1/models)"
        )
        parser.add_argument(
            "--volume",
            default=str(settings.VAR_DIR / "adapter-volume"),
            help="adapter folder; workers and vLLM see it at the same path",
        )
        parser.add_argument(
            "--max-loras",
            type=int,
            default=None,
            help="default: the server's own, from the max_lora label of its /metrics (else 4)",
        )
        parser.add_argument("--max-cpu-loras", type=int, default=8)
        parser.add_argument("--max-lora-rank", type=int, default=16)
        parser.add_argument("--api-key", default="", help="vLLM --api-key, if it has one")
        parser.add_argument(
            "--api-key-file",
            default="",
            help="the same, read from this file ('-': standard input), kept off the command line",
        )
        parser.add_argument(
            "--as-user", default="", help="platform admin recorded in the audit (default: first)"
        )

    def handle(self, *args, **options):
        if options["api_key_file"]:
            options["api_key"] = self._read_key(options["api_key_file"])
        urls = [u.rstrip("/") for u in options["url"]]
        url = urls[0]
        base_card = self._base_card(url, options["api_key"])
        name = options["base_model_name"] or (base_card.id if base_card else "")
        if not name:
            raise CommandError(f"Cannot read the base model's served name from {url}/v1/models.")
        model_path = options["base_model_path"]
        served_from = Path(base_card.root) if base_card and base_card.root else None
        if not model_path and served_from and (served_from / "config.json").is_file():
            model_path = str(served_from)
        existing = Deployment.objects.filter(name=options["name"]).first()
        max_loras = options["max_loras"] or self._max_lora(url, options["api_key"]) or 4
        volume = Path(options["volume"]).resolve()
        volume.mkdir(parents=True, exist_ok=True)
        values = {
            "environment": options["environment"],
            "base_model_name": name,
            "replica_urls": urls,
            "volume_write_path": str(volume),
            "volume_serve_path": str(volume),
            "max_loras": max_loras,
            "max_cpu_loras": options["max_cpu_loras"],
            "max_lora_rank": options["max_lora_rank"],
            "requires_promotion_approval": False,
        }
        if model_path:
            resolved = Path(model_path).resolve()
            values["base_model_path"] = str(resolved)
            # vLLM reports its base model's root as it was started, symlinks
            # and all (a clone under macOS's /tmp, a linked home): every
            # spelling of the same folder is the record's, or the facts check
            # disputes the replica and refuses every promotion.
            spellings = [str(Path(model_path).absolute()), str(resolved)]
            if served_from is not None and served_from.resolve() == resolved:
                spellings.append(str(served_from))
            aliases = list(existing.base_model_aliases or []) if existing else []
            values["base_model_aliases"] = aliases + [a for a in spellings if a not in aliases]
        if options["api_key"]:
            values["vllm_api_key"] = options["api_key"]
        actor = system_actor(self._admin(options["as_user"]))
        try:
            if existing is None:
                deployment = deployment_create(actor=actor, name=options["name"], **values)
                verb = "Registered"
            else:
                deployment = deployment_update(actor=actor, deployment=existing, **values)
                verb = "Updated"
        except ApplicationError as error:
            raise CommandError(str(error)) from None
        self.stdout.write(
            self.style.SUCCESS(
                f"{verb} deployment {deployment.name} ({deployment.environment}): "
                f"{', '.join(urls)}, base model {name}, max_loras {max_loras}, "
                f"adapter volume {volume}"
            )
        )
        if not deployment.module_dims:
            self.stdout.write(
                self.style.WARNING(
                    "No config.json for the base model: the gate will refuse promotions "
                    "until the deployment's identity is entered (or pass --base-model-path)."
                )
            )

    @staticmethod
    def _read_key(path: str) -> str:
        try:
            key = (sys.stdin.read(4096) if path == "-" else Path(path).read_text()).strip()
        except OSError as error:
            raise CommandError(f"--api-key-file {path}: {error.strerror}") from None
        if not key:
            raise CommandError(f"--api-key-file {path} is empty.")
        return key

    def _base_card(self, url: str, api_key: str):
        with VLLMClient(url, api_key=api_key or None, timeout=10) as client:
            listing = client.list_models()
        if not listing.ok:
            raise CommandError(
                f"GET {url}/v1/models failed: {listing.status_code or ''} {listing.error}"
            )
        return next((card for card in model_cards(listing) if not card.is_adapter), None)

    def _max_lora(self, url: str, api_key: str) -> int | None:
        """The replica's real --max-loras: typed by hand it is what the gate trusts."""
        with VLLMClient(url, api_key=api_key or None, timeout=10) as client:
            return max_lora_from_metrics(client.metrics())

    def _admin(self, username: str):
        users = get_user_model().objects.filter(is_active=True, is_staff=True)
        user = users.filter(username=username).first() if username else users.order_by("pk").first()
        if user is None:
            raise CommandError("No platform admin (a staff user) to record the change as.")
        return user
