"""manage.py plan: the capacity planner from a shell.

manage.py plan --config path/to/config.json --gpu-type L40S --use-cases 10 --price 1.9
manage.py plan --deployment staging-cpu --context-length 8192
manage.py plan ... --json
"""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from observability.api.serializers import PlannerInputSerializer
from observability.planning import OVERRIDES, plan_for
from serving.models import Deployment
from serving.rules.planner import PlannerInputError

MIB = 1024**2


def _size(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB" if n >= 1024**3 else f"{n / MIB:.2f} MiB"


class Command(BaseCommand):
    help = "GPU memory, LoRA pool, KV cache and consolidation economics of a vLLM deployment."

    def add_arguments(self, parser):
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument("--config", type=Path, help="a base model's config.json")
        source.add_argument("--deployment", help="plan an existing deployment")
        parser.add_argument("--dtype")
        parser.add_argument("--gpu-type")
        parser.add_argument("--gpu-memory-bytes", type=int)
        parser.add_argument("--gpu-memory-utilization", type=float)
        parser.add_argument("--gpus-per-replica", type=int)
        parser.add_argument("--max-loras", type=int)
        parser.add_argument("--max-cpu-loras", type=int)
        parser.add_argument("--max-lora-rank", type=int)
        parser.add_argument("--target-modules", help="comma-separated")
        parser.add_argument("--context-length", type=int)
        parser.add_argument("--use-cases", type=int)
        parser.add_argument("--price", dest="price_per_gpu_hour", type=float, help="per GPU-hour")
        parser.add_argument("--json", action="store_true", help="print the plan as JSON")

    def handle(self, *args, **options):
        data = {
            key: options[key]
            # The overrides this command has options for; the others are None.
            for key in ("dtype", *OVERRIDES)
            if options.get(key) is not None
        }
        if options["target_modules"]:
            data["target_modules"] = [
                m.strip() for m in options["target_modules"].split(",") if m.strip()
            ]
        deployment = None
        if options["deployment"]:
            deployment = Deployment.objects.filter(name=options["deployment"]).first()
            if deployment is None:
                raise CommandError(f"No deployment named {options['deployment']!r}.")
            data["deployment"] = deployment.name
        else:
            try:
                data["config"] = json.loads(options["config"].read_text())
            except (OSError, ValueError) as error:
                raise CommandError(f"--config: {error}") from None
        serializer = PlannerInputSerializer(data=data)
        if not serializer.is_valid():
            raise CommandError(json.dumps(serializer.errors))
        try:
            plan = plan_for(serializer.validated_data, deployment)
        except PlannerInputError as error:
            raise CommandError(json.dumps(error.fields)) from None
        if options["json"]:
            self.stdout.write(json.dumps(plan.as_dict(), indent=2))
            return
        e = plan.economics
        rows = [
            ("GPU memory", f"{_size(plan.vram_bytes)} ({plan.gpu_type or 'as given'})"),
            ("usable", _size(plan.usable_bytes)),
            ("base weights", f"{_size(plan.base_weights_bytes)} ({plan.parameters:,} parameters)"),
            ("LoRA pool", f"{_size(plan.lora_pool_bytes)} ({_size(plan.lora_slot_bytes)} a slot)"),
            ("LoRA share", f"{plan.lora_share:.1%} ({plan.lora_share_verdict} the advised 10-15%)"),
            ("CPU cache (host)", _size(plan.cpu_cache_bytes)),
            ("activations", f"{_size(plan.reserve_bytes)} (estimate)"),
            ("KV cache", f"{_size(plan.kv_cache_bytes)} = {plan.kv_cache_tokens:,} tokens"),
            ("KV share", f"{plan.kv_share:.1%}"),
            ("concurrent seqs", str(plan.concurrent_sequences)),
            ("max_loras", f"recommend {plan.max_loras_recommended}: {plan.recommendation}"),
            ("", f"at most {plan.max_loras_within_share} fit the LoRA share"),
            (
                f"{e.use_cases} use case(s)",
                f"dedicated {e.dedicated_gpus} GPUs, {_size(e.dedicated_vram_bytes)}, "
                f"{e.dedicated_cost_per_month:,.2f}/month",
            ),
            (
                "",
                f"shared {e.shared_gpus} GPUs, {_size(e.shared_vram_bytes)}, "
                f"{e.shared_cost_per_month:,.2f}/month (saves {e.saving_per_month:,.2f})",
            ),
            *[("warning", w) for w in plan.warnings],
        ]
        lines = [f"{label:<18} {value}" for label, value in rows]
        self.stdout.write("\n".join(lines))
