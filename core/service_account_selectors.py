"""Reads of service accounts, through the actor's visibility: members see their
departments' accounts (names, not tokens), platform admins every one."""

from __future__ import annotations

from django.db.models import QuerySet

from core.access import visible_department_ids
from core.actors import Actor
from core.errors import NotFound
from core.models import ServiceAccount


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
