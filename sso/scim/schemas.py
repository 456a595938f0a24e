"""The SCIM schemas this server advertises (GET /scim/v2/Schemas): django-scim2's
core User and Group schemas cut down to the attributes that are stored here.
A client that reads them (scim2-tester, an IdP's attribute mapper) then sends
only what comes back; the other core User attributes are accepted and ignored
(adapters.IGNORED_USER_ATTRIBUTES), anything else is a 400."""

from __future__ import annotations

import copy

from django_scim.constants import SchemaURI
from django_scim.schemas import ALL

STORED_USER = {"userName", "name", "active", "emails", "groups"}
STORED_NAME = {"givenName", "familyName"}
STORED_EMAIL = {"value", "type", "primary"}


def _trimmed() -> list[dict]:
    by_id = {schema["id"]: copy.deepcopy(schema) for schema in ALL}
    user = by_id[SchemaURI.USER]
    user["attributes"] = [a for a in user["attributes"] if a["name"] in STORED_USER]
    for attribute in user["attributes"]:
        if attribute["name"] == "name":
            attribute["subAttributes"] = [
                s for s in attribute["subAttributes"] if s["name"] in STORED_NAME
            ]
        if attribute["name"] == "emails":
            attribute["subAttributes"] = [
                s for s in attribute["subAttributes"] if s["name"] in STORED_EMAIL
            ]
    group = by_id[SchemaURI.GROUP]
    for attribute in group["attributes"]:
        if attribute["name"] == "displayName":
            attribute["required"] = True  # RFC 7643 §4.2: "REQUIRED"; the store needs it
    for schema in (user, group):
        # The library's files lack them; RFC 7643 §7 resources carry both.
        schema["schemas"] = ["urn:ietf:params:scim:schemas:core:2.0:Schema"]
        schema["meta"] = {"resourceType": "Schema", "location": f"/Schemas/{schema['id']}"}
    return [user, group]


SCHEMAS = _trimmed()


def schemas_getter() -> list[dict]:
    return SCHEMAS
