"""Who is acting, and from where: the one argument every service takes."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from django.contrib.auth.models import AnonymousUser

from core.middleware import current_request_id

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from core.models import ApiToken


@dataclass(frozen=True)
class Actor:
    user: User
    token: ApiToken | None = None
    request_id: str = ""
    client_address: str | None = None
    # Memoised department roles: {department_id: role}; filled on first use.
    _roles: dict = field(default_factory=dict, compare=False, repr=False)
    # Other per-request answers of core.access (visible departments).
    _memo: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def is_platform_admin(self) -> bool:
        # A token never carries its creator's admin rights.
        return self.token is None and bool(self.user.is_active and self.user.is_staff)

    @property
    def people(self) -> frozenset[int]:
        """The user ids of every person behind this act: the acting user, the
        creator of the token used and, for a service account's token, the
        creator of the account. Recorded with each act so that four-eyes
        (core.access.can_review) sees through a pipeline its reviewer set up."""
        ids = {self.user.pk}
        if self.token is not None:
            ids.add(self.token.created_by_id)
            account = self.token.service_account if self.token.service_account_id else None
            if account is not None:
                ids.add(account.created_by_id)
        return frozenset(ids)

    @property
    def label(self) -> str:
        if self.token is not None:
            account = self.token.service_account
            if account is not None:
                return (
                    f"service:{account} token:{self.token.prefix} "
                    f"(created by {account.created_by.get_username()})"
                )
            return f"token:{self.token.prefix} ({self.user.get_username()})"
        return self.user.get_username()


def client_address_of(request) -> str | None:
    """The client's address, for the audit log and sign-in throttling.

    X-Forwarded-For is client-controlled except for what the trusted proxies
    appended: with TRUSTED_PROXY_COUNT = N, the N-th entry from the right is
    the address the first proxy saw. Anything short of that (no header, fewer
    entries, not an address) falls back to REMOTE_ADDR, never to a value the
    client wrote."""
    from django.conf import settings

    remote = request.META.get("REMOTE_ADDR") or None
    count = getattr(settings, "TRUSTED_PROXY_COUNT", 0)
    if count <= 0:
        return remote
    forwarded = [a.strip() for a in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
    forwarded = [a for a in forwarded if a]
    if len(forwarded) < count:
        return remote
    candidate = forwarded[-count]
    try:
        return str(ipaddress.ip_address(candidate))
    except ValueError:
        return remote


def actor_from_request(request) -> Actor:
    from core.models import ApiToken

    user = request.user
    if isinstance(user, AnonymousUser) or not user.is_authenticated:
        raise ValueError("actor_from_request needs an authenticated request")
    token = getattr(request, "auth", None)
    return Actor(
        user=user,
        token=token if isinstance(token, ApiToken) else None,
        request_id=getattr(request, "request_id", "") or current_request_id(),
        client_address=client_address_of(request),
    )


def system_actor(user) -> Actor:
    """For management commands and Celery tasks acting on a person's behalf."""
    return Actor(user=user, request_id=current_request_id())
