"""OIDC_GROUP_MAP: which identity-provider group gives which department role.

    legal-approvers=legal:approver,legal-team=legal:member,platform-admins=admin

A group may appear more than once (one group, several departments). Parsed at
start-up, so a typo stops the process instead of silently granting nothing.
Pure Python: config/settings.py imports it before Django is set up.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from django.core.exceptions import ImproperlyConfigured

ADMIN_TARGET = "admin"
ROLES = ("member", "approver")  # registry.models.Role, weakest first
# Department slugs as registry.models.Department accepts them (SlugField).
_SLUG = re.compile(r"^[-a-zA-Z0-9_]{1,64}$")


@dataclass(frozen=True)
class GroupMap:
    # {group: ((department_slug, role), ...)}
    roles: dict[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    admin_groups: frozenset[str] = frozenset()

    @property
    def managed_departments(self) -> frozenset[str]:
        """Departments whose memberships the provider decides for SSO users."""
        return frozenset(slug for targets in self.roles.values() for slug, _ in targets)

    @property
    def manages_admin(self) -> bool:
        return bool(self.admin_groups)

    def wanted_roles(self, groups: list[str]) -> dict[str, str]:
        """{department_slug: role} for these groups; the strongest role wins."""
        wanted: dict[str, str] = {}
        for group in groups:
            for slug, role in self.roles.get(group, ()):
                if ROLES.index(role) >= ROLES.index(wanted.get(slug, ROLES[0])):
                    wanted[slug] = role
        return wanted

    def is_admin(self, groups: list[str]) -> bool:
        return any(group in self.admin_groups for group in groups)

    def unmapped(self, groups: list[str]) -> list[str]:
        return [g for g in groups if g not in self.roles and g not in self.admin_groups]


def parse_group_map(raw: str, variable: str = "OIDC_GROUP_MAP") -> GroupMap:
    roles: dict[str, list[tuple[str, str]]] = {}
    admin_groups: set[str] = set()
    for entry in (part.strip() for part in raw.split(",")):
        if not entry:
            continue
        group, sep, target = (piece.strip() for piece in entry.partition("="))
        if not sep or not group or not target:
            raise ImproperlyConfigured(
                f"{variable}: {entry!r} is not group=department:role or group=admin"
            )
        if target == ADMIN_TARGET:
            admin_groups.add(group)
            continue
        slug, colon, role = (piece.strip() for piece in target.partition(":"))
        if not colon or not _SLUG.match(slug):
            raise ImproperlyConfigured(
                f"{variable}: {entry!r} is not group=department:role or group=admin "
                "(department is a department's slug)"
            )
        if role not in ROLES:
            raise ImproperlyConfigured(
                f"{variable}: {entry!r} names the role {role!r}; use one of {list(ROLES)}"
            )
        roles.setdefault(group, []).append((slug, role))
    return GroupMap(
        roles={group: tuple(targets) for group, targets in roles.items()},
        admin_groups=frozenset(admin_groups),
    )
