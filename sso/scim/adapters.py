"""django-scim2 adapters: SCIM JSON in and out for ScimUser and ScimGroup.

The library's own adapters write to the models directly; these parse and
check every attribute (a clear 400 in SCIM's error shape naming it) and hand
the result to sso.scim.services, where the writes are audited.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin

from django.contrib.auth.validators import UnicodeUsernameValidator
from django.core.exceptions import ValidationError
from django.core.validators import EmailValidator
from django.urls import reverse
from django_scim import adapters as scim_adapters
from django_scim import exceptions
from django_scim.constants import SchemaURI

from sso.scim import services
from sso.scim.filters import GROUP_ATTRIBUTES, USER_ATTRIBUTES

if TYPE_CHECKING:
    from sso.models import ScimGroup, ScimUser

USER_URN = SchemaURI.USER.lower()
GROUP_URN = SchemaURI.GROUP.lower()
ENTERPRISE_URN = SchemaURI.ENTERPRISE_URN.lower()
# Core User attributes (RFC 7643 §4.1) that are not stored here: accepted and
# ignored, so an identity provider's default attribute mapping still works.
IGNORED_USER_ATTRIBUTES = {
    "displayname",
    "nickname",
    "profileurl",
    "title",
    "usertype",
    "preferredlanguage",
    "locale",
    "timezone",
    "password",
    "phonenumbers",
    "ims",
    "photos",
    "addresses",
    "entitlements",
    "roles",
    "x509certificates",
}
# Read-only or set by the server: ignored in a request body (RFC 7643 §3.1).
SERVER_ATTRIBUTES = {"schemas", "id", "meta", "groups"}
_EMAIL_VALUE_PATH = re.compile(r"^emails\[.{1,200}\]\.value$", re.IGNORECASE)
_MEMBER_VALUE_PATH = re.compile(r'^members\[\s*value\s+eq\s+"([^"]{1,64})"\s*\]$', re.IGNORECASE)


def bad(detail: str, scim_type: str = "invalidValue") -> exceptions.BadRequestError:
    return exceptions.BadRequestError(detail, scim_type=scim_type)


def _string(value, name: str, *, max_length: int, required: bool = False) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise bad(f"{name} must be a string, not {type(value).__name__}.")
    value = value.strip()
    if required and not value:
        raise bad(f"{name} is required and must not be empty.")
    if len(value) > max_length:
        raise bad(f"{name} is longer than {max_length} characters.")
    return value


def _boolean(value, name: str) -> bool:
    if isinstance(value, bool):
        return value
    # Microsoft Entra has sent "True"/"False" strings in PATCH for years.
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise bad(f"{name} must be a boolean, not {type(value).__name__}.")


def _user_name(value) -> str:
    name = _string(value, "userName", max_length=150, required=True)
    try:
        UnicodeUsernameValidator()(name)
    except ValidationError:
        raise bad(
            "userName may contain only letters, digits and @ . + - _ (at most 150)."
        ) from None
    return name


def _email(value) -> str:
    email = _string(value, "emails.value", max_length=254)
    if email:
        try:
            EmailValidator()(email)
        except ValidationError:
            raise bad(f"{email[:100]!r} is not an email address.") from None
    return email


def _emails(value, data: services.UserData) -> None:
    """The primary address, or the first: one email is kept per person."""
    data.email, data.email_type, data.email_primary = "", "", True
    if value is None:
        return
    if not isinstance(value, list):
        raise bad("emails must be a list of {value, type, primary}.")
    if len(value) > 20:
        raise bad("emails has more than 20 entries.")
    for entry in value:
        if not isinstance(entry, dict):
            raise bad("emails must be a list of {value, type, primary}.")
    chosen = [e for e in value if e.get("primary") is True] or value
    if chosen:
        data.email = _email(chosen[0].get("value"))
        data.email_type = _string(chosen[0].get("type"), "emails.type", max_length=20)
        primary = chosen[0].get("primary")
        data.email_primary = True if primary is None else _boolean(primary, "emails.primary")


def _name(value, data: services.UserData, *, partial: bool) -> None:
    if value is None:
        if not partial:
            data.given_name = data.family_name = ""
        return
    if not isinstance(value, dict):
        raise bad("name must be an object with givenName and familyName.")
    for key, sub in value.items():
        lowered = key.lower() if isinstance(key, str) else ""
        if lowered == "givenname":
            data.given_name = _string(sub, "name.givenName", max_length=150)
        elif lowered == "familyname":
            data.family_name = _string(sub, "name.familyName", max_length=150)
    if not partial:
        keys = {k.lower() for k in value if isinstance(k, str)}
        if "givenname" not in keys:
            data.given_name = ""
        if "familyname" not in keys:
            data.family_name = ""


def _body(d) -> dict:
    if not isinstance(d, dict):
        raise bad("The request body must be a JSON object.", "invalidSyntax")
    return d


# Members one request may name: each is looked up and re-synced in the request.
MAX_MEMBERS = 5000


def _members(value) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise bad("members must be a list of {value}.")
    if len(value) > MAX_MEMBERS:
        raise bad(
            f"At most {MAX_MEMBERS} members in one request; send the rest in PATCHes.", "tooMany"
        )
    ids = []
    for entry in value:
        if not isinstance(entry, dict) or not isinstance(entry.get("value"), str):
            raise bad("Each member must be an object with a string value (a user's id).")
        ids.append(entry["value"][:64])
    return ids


def _without_urn(path: str, urn: str) -> str | None:
    """A path without its schema's URN prefix; None for the enterprise extension."""
    lowered = path.lower()
    if lowered.startswith(urn + ":"):
        return path[len(urn) + 1 :]
    if lowered.startswith(ENTERPRISE_URN):
        return None
    return path


def _operations(operations) -> list[tuple[str, str, object]]:
    if not isinstance(operations, list) or not operations:
        raise bad("Operations must be a non-empty list.", "invalidSyntax")
    if len(operations) > 1000:
        raise bad("At most 1000 operations in one PATCH.", "tooMany")
    # (op, path, value); an operation without a path gives one per key of its value.
    parsed: list[tuple[str, str, object]] = []
    for operation in operations:
        if not isinstance(operation, dict):
            raise bad("Each operation must be an object with op, path and value.", "invalidSyntax")
        op = operation.get("op")
        if not isinstance(op, str) or op.lower() not in ("add", "remove", "replace"):
            raise bad(f"op must be add, remove or replace, not {str(op)[:20]!r}.", "invalidSyntax")
        path = operation.get("path")
        if path is not None and (not isinstance(path, str) or not 0 < len(path) <= 300):
            raise bad("path must be a non-empty string of at most 300 characters.", "invalidPath")
        value = operation.get("value")
        if path is None:
            if op.lower() == "remove":
                raise bad("A remove operation needs a path.", "noTarget")
            if not isinstance(value, dict):
                raise bad(
                    "An operation without a path needs an object as its value.", "invalidValue"
                )
            parsed.extend((op.lower(), key, sub) for key, sub in value.items())
        else:
            parsed.append((op.lower(), path, value))
    return parsed


class _Location:
    # Set by django-scim2's adapter (untyped): the HttpRequest, carrying the
    # `scim_actor` that sso.scim.views puts on it.
    request: Any

    def _base(self) -> str:
        return f"{self.request.scheme}://{self.request.get_host()}"


def _resource_type(cls, request, endpoint: str) -> dict:
    d = super(cls, cls).resource_type_dict(request)
    # RFC 7643 §6: relative to the base URL; the library gives the whole path,
    # which a client appends to the base (/scim/v2/scim/v2/Users).
    d["endpoint"] = endpoint
    return d


class ScimUserAdapter(_Location, scim_adapters.SCIMUser):
    id_field = "scim_id"
    ATTR_MAP = USER_ATTRIBUTES

    obj: ScimUser

    def __init__(self, obj, request=None):
        super().__init__(obj, request)
        self.data: services.UserData | None = None

    @classmethod
    def resource_type_dict(cls, request=None) -> dict:
        return _resource_type(cls, request, "/Users")

    @property
    def location(self) -> str:
        return urljoin(self._base(), self.path)

    def _current(self) -> services.UserData:
        user = self.obj.user
        return services.UserData(
            user_name=user.username,
            given_name=user.first_name,
            family_name=user.last_name,
            email=user.email,
            active=user.is_active,
            external_id=self.obj.external_id,
            email_type=self.obj.email_type,
            email_primary=self.obj.email_primary,
        )

    def to_dict(self) -> dict:
        user = self.obj.user
        groups = [
            {
                "value": group.scim_id,
                "$ref": urljoin(
                    self._base(), reverse("scim:groups", kwargs={"uuid": group.scim_id})
                ),
                "display": group.display_name,
            }
            for group in self.obj.groups.all()
        ]
        name = {
            key: value
            for key, value in (("givenName", user.first_name), ("familyName", user.last_name))
            if value
        }
        d = {
            "schemas": [SchemaURI.USER],
            "id": self.obj.scim_id,
            "userName": user.username,
            "active": user.is_active,
            "meta": {
                "resourceType": "User",
                "created": self.obj.created_at.isoformat(),
                "lastModified": self.obj.updated_at.isoformat(),
                "location": self.location,
            },
        }
        if self.obj.external_id:
            d["externalId"] = self.obj.external_id
        if name:
            d["name"] = name
        if user.email:
            email = {"value": user.email, "primary": self.obj.email_primary}
            if self.obj.email_type:
                email["type"] = self.obj.email_type
            d["emails"] = [email]
        if groups:
            d["groups"] = groups
        return d

    def validate_dict(self, d) -> None:
        _body(d)

    def from_dict(self, d) -> None:
        """A whole User (POST, PUT): attributes left out are emptied."""
        d = _body(d)
        data = services.UserData(user_name="")
        seen_user_name = False
        for key, value in d.items():
            if not isinstance(key, str):
                raise bad("Attribute names must be strings.", "invalidSyntax")
            name = _without_urn(key, USER_URN)
            if name is None:
                continue
            lowered = name.lower()
            if lowered == "username":
                data.user_name = _user_name(value)
                seen_user_name = True
            elif lowered == "name":
                _name(value, data, partial=False)
            elif lowered == "emails":
                _emails(value, data)
            elif lowered == "active":
                data.active = True if value is None else _boolean(value, "active")
            elif lowered == "externalid":
                data.external_id = _string(value, "externalId", max_length=255)
            elif lowered in SERVER_ATTRIBUTES or lowered in IGNORED_USER_ATTRIBUTES:
                continue
            else:
                raise bad(f"{key[:100]!r} is not an attribute of a User here.")
        if not seen_user_name:
            raise bad("userName is required.")
        self.data = data

    def save(self) -> None:
        actor = self.request.scim_actor
        data = self.data
        assert data is not None, "from_dict() or handle_operations() comes first"
        if self.obj.pk is None:
            self.obj = services.scim_user_create(actor=actor, data=data)
        else:
            self.obj = services.scim_user_replace(actor=actor, scim_user=self.obj, data=data)
        self.obj.refresh_from_db()

    def delete(self) -> None:
        services.scim_user_delete(actor=self.request.scim_actor, scim_user=self.obj)

    def handle_operations(self, operations) -> None:
        data = self._current()
        for op, path, value in _operations(operations):
            self._apply(data, op, path, value)
        self.data = data
        self.save()

    def _apply(self, data: services.UserData, op: str, path: str, value) -> None:
        name = _without_urn(path, USER_URN)
        if name is None:
            return
        lowered = name.lower()
        remove = op == "remove"
        if lowered == "username":
            if remove:
                raise bad("userName is required; it cannot be removed.", "mutability")
            data.user_name = _user_name(value)
        elif lowered == "active":
            data.active = False if remove else _boolean(value, "active")
        elif lowered == "name":
            if remove:
                data.given_name = data.family_name = ""
            else:
                _name(value, data, partial=True)
        elif lowered == "name.givenname":
            data.given_name = "" if remove else _string(value, "name.givenName", max_length=150)
        elif lowered == "name.familyname":
            data.family_name = "" if remove else _string(value, "name.familyName", max_length=150)
        elif lowered == "emails":
            if remove:
                data.email = ""
            else:
                _emails(value, data)
        elif _EMAIL_VALUE_PATH.match(name):
            data.email = "" if remove else _email(value)
        elif lowered == "externalid":
            data.external_id = "" if remove else _string(value, "externalId", max_length=255)
        elif lowered.split(".")[0].split("[")[0] in IGNORED_USER_ATTRIBUTES:
            return
        elif lowered.split(".")[0].split("[")[0] in SERVER_ATTRIBUTES:
            raise bad(f"{path[:100]!r} is read-only.", "mutability")
        else:
            raise bad(f"{path[:100]!r} is not an attribute of a User here.", "invalidPath")


class ScimGroupAdapter(_Location, scim_adapters.SCIMGroup):
    id_field = "scim_id"
    ATTR_MAP = GROUP_ATTRIBUTES

    obj: ScimGroup

    def __init__(self, obj, request=None):
        super().__init__(obj, request)
        self.data: services.GroupData | None = None

    @classmethod
    def resource_type_dict(cls, request=None) -> dict:
        return _resource_type(cls, request, "/Groups")

    @property
    def location(self) -> str:
        return urljoin(self._base(), self.path)

    @property
    def display_name(self) -> str:
        return self.obj.display_name

    def to_dict(self) -> dict:
        members = [
            {
                "value": member.scim_id,
                "$ref": urljoin(
                    self._base(), reverse("scim:users", kwargs={"uuid": member.scim_id})
                ),
                "type": "User",
            }
            for member in self.obj.members.select_related("user")
        ]
        d = {
            "schemas": [SchemaURI.GROUP],
            "id": self.obj.scim_id,
            "displayName": self.obj.display_name,
            "meta": {
                "resourceType": "Group",
                "created": self.obj.created_at.isoformat(),
                "lastModified": self.obj.updated_at.isoformat(),
                "location": self.location,
            },
        }
        if self.obj.external_id:
            d["externalId"] = self.obj.external_id
        if members:
            d["members"] = members
        return d

    def validate_dict(self, d) -> None:
        _body(d)

    def from_dict(self, d) -> None:
        d = _body(d)
        data = services.GroupData(display_name="", members=[])
        seen_name = False
        for key, value in d.items():
            if not isinstance(key, str):
                raise bad("Attribute names must be strings.", "invalidSyntax")
            name = _without_urn(key, GROUP_URN) or key
            lowered = name.lower()
            if lowered == "displayname":
                data.display_name = _string(value, "displayName", max_length=255, required=True)
                seen_name = True
            elif lowered == "externalid":
                data.external_id = _string(value, "externalId", max_length=255)
            elif lowered == "members":
                data.members = _members(value)
            elif lowered in SERVER_ATTRIBUTES:
                continue
            else:
                raise bad(f"{key[:100]!r} is not an attribute of a Group here.")
        if not seen_name:
            raise bad("displayName is required.")
        self.data = data

    def save(self) -> None:
        actor = self.request.scim_actor
        data = self.data
        assert data is not None, "from_dict() comes first"
        if self.obj.pk is None:
            self.obj = services.scim_group_create(actor=actor, data=data)
        else:
            self.obj = services.scim_group_change(
                actor=actor,
                group=self.obj,
                display_name=data.display_name,
                external_id=data.external_id,
                set_members=data.members,
            )
        self.obj.refresh_from_db()

    def delete(self) -> None:
        services.scim_group_delete(actor=self.request.scim_actor, group=self.obj)

    def handle_operations(self, operations) -> None:
        change: dict = {"add_members": [], "remove_members": []}
        for op, path, value in _operations(operations):
            self._apply(change, op, path, value)
        self.obj = services.scim_group_change(
            actor=self.request.scim_actor, group=self.obj, **change
        )
        self.obj.refresh_from_db()

    def _apply(self, change: dict, op: str, path: str, value) -> None:
        name = _without_urn(path, GROUP_URN) or path
        lowered = name.lower()
        member = _MEMBER_VALUE_PATH.match(name)
        if member and op == "remove":
            change["remove_members"].append(member.group(1))
        elif lowered == "members":
            if op == "remove":
                if value is None:
                    change["set_members"] = []
                    change["add_members"] = []
                else:
                    change["remove_members"].extend(_members(value))
            elif op == "add":
                change["add_members"].extend(_members(value))
            else:
                change["set_members"] = _members(value)
                change["add_members"] = []
                change["remove_members"] = []
        elif lowered == "displayname":
            if op == "remove":
                raise bad("displayName is required; it cannot be removed.", "mutability")
            change["display_name"] = _string(value, "displayName", max_length=255, required=True)
        elif lowered == "externalid":
            change["external_id"] = (
                "" if op == "remove" else _string(value, "externalId", max_length=255)
            )
        elif lowered in SERVER_ATTRIBUTES:
            raise bad(f"{path[:100]!r} is read-only.", "mutability")
        else:
            raise bad(f"{path[:100]!r} is not an attribute of a Group here.", "invalidPath")
