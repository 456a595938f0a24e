"""Who may call what through a deployment's front door: the table the door
enforces, a pure value computed by `serving.door.selectors.door_access`.

The door never sees a key: it hashes the `Authorization: Bearer` value
(SHA-256, lowercase hex) and looks the hash up in `keys`. A caller is a
department (a key belongs to one, whether it was issued to the department, a
service account or a person), and `allowed` says which served names each
department may call here: its own department's adapters on a deployment it may
use, the base model, and adapters of other departments through an approved,
unexpired grant (until its end, which the door checks against its own clock).
Anything else is answered as if it did not exist (404).

Limits (serving/rules/quotas.py): `rpm` is requests per minute per key and per
department ("key:<id>", "dept:<slug>"), counted by the door itself; `limited`
holds the callers the door refuses until a time because metered tokens crossed
a limit. Both answer 429 in OpenAI's shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from serving.rules.quotas import Limited


@dataclass(frozen=True)
class CallerKey:
    key_id: int
    department: str  # the department's slug: who is billed and whose grants apply
    expires_at: int  # epoch seconds; the door refuses the key from then on


@dataclass(frozen=True)
class DoorAccess:
    deployment: str
    # An open door takes every request without a key (a laptop; never the default).
    open: bool = False
    keys: Mapping[str, CallerKey] = field(default_factory=dict)  # sha256 hex -> caller
    allowed: frozenset[tuple[str, str]] = frozenset()  # (department slug, served name)
    # The deployment's vLLM API key (Deployment.vllm_api_key), which the door
    # sends to the replicas in place of the caller's; empty: they take none.
    # Out of the repr, so that a logged or failed table never shows it.
    upstream_key: str = field(default="", repr=False)
    # Served name -> the id of the adapter version served under it: the door
    # writes it into each request's id, for metering (observability.metering).
    versions: Mapping[str, int] = field(default_factory=dict)
    rpm: Mapping[str, int] = field(default_factory=dict)  # caller entry -> requests a minute
    limited: Mapping[str, Limited] = field(default_factory=dict)  # caller entry -> refused until
    # (department slug, served name) -> epoch seconds: a pair `allowed` only
    # through a grant ends then. The door compares it with its clock, so an
    # expired grant is refused at its end, not at the next sync.
    grant_ends: Mapping[tuple[str, str], int] = field(default_factory=dict)

    def models_for(self, department: str) -> list[str]:
        """The served names a department may call here, sorted: what
        `GET /v1/models` lists for its keys."""
        return sorted(model for dept, model in self.allowed if dept == department)
