"""Mints, lists and revokes the identity provider's SCIM tokens (audited).

    manage.py scim_token create --name entra --admin alice [--days 365]
    manage.py scim_token list
    manage.py scim_token revoke --prefix lrs_AbCdEfGh --admin alice

`--admin` names the platform admin the audit log records as minting it; the
secret is printed once and never stored."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from core.actors import system_actor
from core.errors import ApplicationError
from sso.models import ScimToken
from sso.scim.tokens import scim_token_create, scim_token_revoke


class Command(BaseCommand):
    help = "Create, list or revoke SCIM tokens for the identity provider."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create")
        create.add_argument("--name", required=True)
        create.add_argument("--admin", required=True, help="a platform admin's username")
        create.add_argument("--days", type=int, default=None)
        sub.add_parser("list")
        revoke = sub.add_parser("revoke")
        revoke.add_argument("--prefix", required=True)
        revoke.add_argument("--admin", required=True)

    def _admin(self, username: str):
        user = get_user_model().objects.filter(username=username, is_active=True).first()
        if user is None:
            raise CommandError(f"No active user named {username!r}.")
        return system_actor(user)

    def handle(self, *args, **options):
        try:
            if options["action"] == "create":
                token, secret = scim_token_create(
                    actor=self._admin(options["admin"]),
                    name=options["name"],
                    expires_in_days=options["days"],
                )
                self.stdout.write(secret)
                self.stderr.write(
                    f"SCIM token {token.prefix}… expires {token.expires_at:%Y-%m-%d}; "
                    "the secret above is shown once."
                )
            elif options["action"] == "list":
                for token in ScimToken.objects.select_related("created_by"):
                    state = (
                        "revoked" if token.revoked_at else f"expires {token.expires_at:%Y-%m-%d}"
                    )
                    used = f"{token.last_used_at:%Y-%m-%d %H:%M}" if token.last_used_at else "never"
                    self.stdout.write(
                        f"{token.prefix}  {token.name}  by {token.created_by}  {state}  used {used}"
                    )
            else:
                token = ScimToken.objects.filter(prefix=options["prefix"]).first()
                if token is None:
                    raise CommandError(f"No SCIM token with prefix {options['prefix']!r}.")
                scim_token_revoke(actor=self._admin(options["admin"]), token=token)
                self.stdout.write(f"Revoked {token.prefix}.")
        except ApplicationError as error:
            raise CommandError(error.message) from None
