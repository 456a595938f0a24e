"""Which lifecycle buttons a viewer sees on a version.

The answer comes from the same table and the same access checks the services
apply (registry.transitions, core.access, the four-eyes rule in
registry.services.versions), so the buttons can never promise more than the
POST will allow. The POST itself still goes through version_transition, which
checks everything again under the row lock.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.access import require_approver, require_contributor
from core.actors import Actor
from core.errors import ApplicationError
from core.models import Ability
from registry.models import AdapterVersion
from registry.services.versions import require_version_four_eyes
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
        try:
            if transition.who == "contributor":
                require_contributor(actor, department_id, Ability.SUBMIT_FOR_REVIEW, "Version")
            else:
                require_approver(actor, department_id, "Version")
        except ApplicationError:
            continue
        reason = ""
        if transition.who == "reviewer":
            try:
                require_version_four_eyes(actor, version)
            except ApplicationError as error:
                reason = error.message
        options.append(
            ActionOption(action, LABELS.get(action, action), transition.comment_required, reason)
        )
    return options
