"""Fact readings: what a replica's answers (/metrics, /v1/models, a refused load)
say it serves, and where that disputes the deployment record. Pure: no writes.

The gate trusts the record (base model, max_loras) to decide what may reach a
replica; a record typed wrong (a server started with --max-loras 4 recorded as
8, another model behind the same served name) makes every check built on it
wrong. Reconcile reads the base model and the max_lora label from what it
already fetches every tick (/v1/models' base card, /metrics); a load vLLM
refuses for its rank names the server's max_lora_rank
(serving.records.fact_records). max_cpu_loras is not
readable from vLLM 0.32 at all. Promotions are refused while a replica disputes
the record (serving.services.promotions).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from serving.lora_metrics import snapshot_of
from serving.vllm_client import AttemptResult, ModelCard

# vLLM's refusal of a load whose rank is above the server's --max-lora-rank
# ("LoRA rank 64 is greater than max_lora_rank 16."): the only place vLLM 0.32
# tells its max_lora_rank (neither /metrics nor any endpoint shows it).
_RANK_REFUSAL = re.compile(r"LoRA rank (\d{1,6}) is greater than max_lora_rank (\d{1,6})")


@dataclass(frozen=True)
class ReportedFlag:
    """A server flag a replica reports outside its /v1/models listing."""

    fact: str  # its key in Replica.reported_facts
    field: str  # the Deployment field that records it
    option: str  # vLLM's command-line option


# max_lora from /metrics (the reconcile's observe step reads it); max_lora_rank
# from a refused load (serving.records.fact_records).
REPORTED_FLAGS = (
    ReportedFlag("max_lora", "max_loras", "--max-loras"),
    ReportedFlag("max_lora_rank", "max_lora_rank", "--max-lora-rank"),
)


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
    snapshot = snapshot_of(result)
    return snapshot.max_lora if snapshot is not None else None


def max_lora_rank_from_refusal(error: str) -> int | None:
    """The server's max_lora_rank named by a refused load's error; None otherwise."""
    found = _RANK_REFUSAL.search((error or "")[:4000])
    return int(found.group(2)) if found else None


def lora_activity_from_metrics(result: AttemptResult) -> tuple[float, set[str]] | None:
    """(when, adapters with requests running or waiting) at vLLM's newest
    vllm:lora_requests_info series: each series' value is the time vLLM recorded
    that state (after an engine step), the older ones are stale states. None
    where the metrics cannot tell: not answered, not Prometheus text, or no
    series (LoRA disabled, or no step run since vLLM started)."""
    snapshot = snapshot_of(result)
    if snapshot is None or snapshot.timestamp is None:
        return None
    return snapshot.timestamp, set(snapshot.active)


def lora_label_sets(result: AttemptResult) -> dict[tuple, float] | None:
    """Every vllm:lora_requests_info label set, (running, waiting) adapter
    names as vLLM lists them, with the time vLLM last stamped it; None where
    the metrics cannot tell (not answered, not Prometheus text)."""
    snapshot = snapshot_of(result)
    if snapshot is None:
        return None
    return {(s.running, s.waiting): s.timestamp for s in snapshot.series}


def busy_adapters_from_metrics(result: AttemptResult) -> set[str] | None:
    activity = lora_activity_from_metrics(result)
    return None if activity is None else activity[1]


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
        for flag in REPORTED_FLAGS:
            reported, recorded = facts.get(flag.fact), getattr(deployment, flag.field)
            if reported is not None and reported != recorded:
                found.append(
                    FactDispute(
                        replica.base_url,
                        flag.field,
                        recorded,
                        reported,
                        f"Set the deployment's {flag.field} to {reported}, or restart the "
                        f"replica with {flag.option} {recorded}.",
                    )
                )
    return found
