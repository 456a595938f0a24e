"""Deployment facts read from the replicas, not typed: what each vLLM replica
says it serves, and where that disputes the deployment record.

The gate trusts the record (base model, max_loras) to decide what may reach a
replica; a record typed wrong (a server started with --max-loras 4 recorded as
8, another model behind the same served name) makes every check built on it
wrong. Reconcile reads the base model from what it already fetches every tick
(/v1/models' base card); observability, which reads /metrics after every
reconcile, reports the max_lora label (serving.services.replica_facts). Promotions
are refused while a replica disputes the record (serving.services.promotions).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from serving.vllm_client import AttemptResult, ModelCard

LORA_INFO = "vllm:lora_requests_info"


@dataclass(frozen=True)
class FactDispute:
    replica: str
    fact: str
    recorded: object
    reported: object
    fix: str

    @property
    def message(self) -> str:
        return (
            f"Replica {self.replica} reports {self.fact} {self.reported!r}, the deployment "
            f"records {self.recorded!r}. {self.fix}"
        )


def base_card_facts(cards: list[ModelCard]) -> dict:
    """{"base_model", "root"} from the base model's card (the one without a parent)."""
    base = next((card for card in cards if not card.is_adapter), None)
    if base is None:
        return {}
    return {"base_model": base.id, "root": base.root or ""}


def max_lora_from_metrics(result: AttemptResult) -> int | None:
    """The max_lora label of vllm:lora_requests_info (every series carries the
    server's --max-loras); None where the server shows no series yet."""
    if not result.ok or not isinstance(result.body, str):
        return None
    try:
        for family in text_string_to_metric_families(result.body):
            for sample in family.samples:
                label = sample.labels.get("max_lora", "")
                if sample.name == LORA_INFO and label.isdigit():
                    return int(label)
    except ValueError:
        return None
    return None


def busy_adapters_from_metrics(result: AttemptResult) -> set[str] | None:
    """Adapters with requests running or waiting at vLLM's newest
    vllm:lora_requests_info series (each series' value is the time vLLM recorded
    it; the older ones are stale states). None where the metrics cannot tell:
    not answered, not Prometheus text, or no series (LoRA disabled, or vLLM has
    not run a step since it started, so nothing can be running)."""
    if not result.ok or not isinstance(result.body, str):
        return None
    newest: tuple[float, set[str]] | None = None
    try:
        for family in text_string_to_metric_families(result.body):
            for sample in family.samples:
                if sample.name != LORA_INFO:
                    continue
                names = set()
                for label in ("running_lora_adapters", "waiting_lora_adapters"):
                    names |= {n for n in sample.labels.get(label, "").split(",") if n}
                if newest is None or sample.value >= newest[0]:
                    newest = (sample.value, names)
    except ValueError:
        return None
    return None if newest is None else newest[1]


def _normalise(name: str) -> str:
    return (name or "").strip().rstrip("/").lower()


def disputes(deployment, replicas) -> list[FactDispute]:
    """Where replicas that answered disagree with the deployment record."""
    found = []
    names = {_normalise(deployment.base_model_name)}
    paths = {_normalise(a) for a in deployment.base_model_aliases or [] if a.startswith("/")}
    for replica in replicas:
        facts = replica.reported_facts or {}
        reported = facts.get("base_model")
        if reported and _normalise(reported) not in names:
            found.append(
                FactDispute(
                    replica.base_url,
                    "base model",
                    deployment.base_model_name,
                    reported,
                    "Correct the deployment's base_model_name, or restart the replica with "
                    "--served-model-name of the recorded model.",
                )
            )
        root = facts.get("root")
        if root and paths and _normalise(root) not in paths:
            found.append(
                FactDispute(
                    replica.base_url,
                    "base model path",
                    sorted(paths),
                    root,
                    "The replica serves weights from another path: add the path to "
                    "base_model_aliases if they are the same weights, or restart the replica "
                    "on the recorded model.",
                )
            )
        max_lora = facts.get("max_lora")
        if max_lora is not None and max_lora != deployment.max_loras:
            found.append(
                FactDispute(
                    replica.base_url,
                    "max_loras",
                    deployment.max_loras,
                    max_lora,
                    f"Set the deployment's max_loras to {max_lora}, or restart the replica "
                    f"with --max-loras {deployment.max_loras}.",
                )
            )
    return found
