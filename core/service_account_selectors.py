"""Reads of service accounts, through the actor's visibility: members see their
departments' accounts (names, not tokens), platform admins every one; and the
service-account tokens a person minted, for offboarding."""

from __future__ import annotations

from django.db.models import QuerySet
from django.utils import timezone

from core.access import visible_department_ids
from core.actors import Actor
from core.errors import NotFound
from core.models import ApiToken, ServiceAccount


def service_accounts_for(actor: Actor) -> QuerySet[ServiceAccount]:
    queryset = ServiceAccount.objects.select_related(
        "department", "user", "created_by", "deactivated_by"
    )
    ids = visible_department_ids(actor)
    return queryset if ids is None else queryset.filter(department_id__in=ids)


def service_account_get(actor: Actor, account_id: int) -> ServiceAccount:
    account = service_accounts_for(actor).filter(pk=account_id).first()
    if account is None:
        raise NotFound("Service account not found.")
    return account


def tokens_minted_by(user) -> QuerySet[ApiToken]:
    """Service-account tokens `user` minted that still work: a leaver's pipelines
    keep them (the department owns them), so offboarding lists them and offers
    to end them (core.services.service_accounts.minted_tokens_revoke)."""
    return (
        ApiToken.objects.select_related("service_account__department")
        .filter(
            created_by=user,
            service_account__isnull=False,
            revoked_at__isnull=True,
            expires_at__gt=timezone.now(),
        )
        .order_by("service_account__department__slug", "service_account__name", "prefix")
    )


def describe_minted(tokens) -> list[dict]:
    """What the audit log and the admin say of each: never the secret."""
    return [
        {"prefix": t.prefix, "name": t.name, "service_account": str(t.service_account)}
        for t in tokens
    ]
