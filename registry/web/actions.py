"""Which lifecycle buttons a viewer sees on a version.

The answer comes from the same table and the same access checks the services
apply (registry.transitions, core.access, the four-eyes rule in
registry.services.versions), so the buttons can never promise more than the
POST will allow. The POST itself still goes through version_transition, which
checks everything again under the row lock.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.access import can_approve, can_contribute, can_review
from core.actors import Actor
from core.models import Ability
from registry.models import AdapterVersion
from registry.services.versions import FOUR_EYES_VERSION
from registry.transitions import TRANSITIONS, allowed_actions_from

LABELS = {
    "submit": "Submit for review",
    "approve": "Approve",
    "reject": "Reject",
    "deprecate": "Deprecate",
    "archive": "Archive",
}


@dataclass(frozen=True)
class ActionOption:
    action: str
    label: str
    comment_required: bool
    disabled_reason: str = ""

    @property
    def is_review(self) -> bool:
        return self.action in {"approve", "reject"}


def version_actions(actor: Actor, version: AdapterVersion) -> list[ActionOption]:
    """Actions valid from the version's status that this actor may take.

    Actions the actor's role never allows are left out. Reviews the four-eyes
    rule forbids are kept, disabled, with the rule's own message as the reason:
    approvers should see why they cannot approve their own work.
    """
    options = []
    department_id = version.adapter.department_id
    for action in allowed_actions_from(version.status):
        transition = TRANSITIONS[action]
        if transition.who == "contributor":
            may = can_contribute(actor, department_id, Ability.SUBMIT_FOR_REVIEW)
        else:
            may = can_approve(actor, department_id)
        if not may:
            continue
        reviewing = transition.who == "reviewer"
        reason = FOUR_EYES_VERSION if reviewing and not can_review(actor, version.authors) else ""
        options.append(
            ActionOption(action, LABELS.get(action, action), transition.comment_required, reason)
        )
    return options
