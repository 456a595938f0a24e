"""The version lifecycle: the one table of allowed status changes.

    registered -> pending_review -> approved | rejected
    approved -> deprecated -> archived

Anything not in this table is refused with a 409 naming the current state.
Who may perform each transition is decided in services.py from `who`. The
actions drive the buttons a page shows; VERSION_TRANSITIONS, the same table by
status, is what core.state.move applies (a compare-and-swap on the old status).
"""

from __future__ import annotations

from dataclasses import dataclass

from core.state import Table
from registry.models import VersionStatus as S


@dataclass(frozen=True)
class Transition:
    action: str
    sources: frozenset[str]
    target: str
    who: str  # "contributor" (member, approver, token with ability) | "reviewer" | "approver"
    comment_required: bool = False


TRANSITIONS: dict[str, Transition] = {
    t.action: t
    for t in (
        Transition("submit", frozenset({S.REGISTERED}), S.PENDING_REVIEW, who="contributor"),
        Transition("approve", frozenset({S.PENDING_REVIEW}), S.APPROVED, who="reviewer"),
        Transition(
            "reject",
            frozenset({S.PENDING_REVIEW}),
            S.REJECTED,
            who="reviewer",
            comment_required=True,
        ),
        Transition("deprecate", frozenset({S.APPROVED}), S.DEPRECATED, who="approver"),
        Transition("archive", frozenset({S.DEPRECATED}), S.ARCHIVED, who="approver"),
    )
}


def allowed_actions_from(status: str) -> list[str]:
    return [t.action for t in TRANSITIONS.values() if status in t.sources]


def _by_status(transitions) -> Table:
    table: dict[str, set[str]] = {status: set() for status in S.values}
    for transition in transitions:
        for source in transition.sources:
            table[source].add(transition.target)
    return {status: frozenset(targets) for status, targets in table.items()}


VERSION_TRANSITIONS: Table = _by_status(TRANSITIONS.values())
