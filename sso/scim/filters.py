"""SCIM filters (RFC 7644 §3.4.2.2) to Django queries, bounded.

scim2-filter-parser (the parser django-scim2 uses) lexes and parses LALR, in
time linear in the filter's length; its transpiler and Django's SQL compiler
recurse once per nesting level. So a filter is refused with a 400
`invalidFilter` before parsing when it is longer than SCIM_FILTER_MAX_LENGTH or
nests deeper than MAX_DEPTH, and when it names an attribute this server does
not map (the library would silently drop it from an `and`, widening the
answer).
"""

from __future__ import annotations

from django.conf import settings
from scim2_filter_parser.lexer import SCIMLexer
from scim2_filter_parser.parser import SCIMParser
from scim2_filter_parser.transpilers.django_q_object import Transpiler

from sso.models import ScimGroup, ScimUser

MAX_DEPTH = 8

USER_ATTRIBUTES = {
    ("id", None, None): "scim_id",
    ("externalId", None, None): "external_id",
    ("userName", None, None): "user__username",
    ("active", None, None): "user__is_active",
    ("name", "givenName", None): "user__first_name",
    ("name", "familyName", None): "user__last_name",
    ("emails", None, None): "user__email",
    ("emails", "value", None): "user__email",
}
GROUP_ATTRIBUTES = {
    ("id", None, None): "scim_id",
    ("externalId", None, None): "external_id",
    ("displayName", None, None): "display_name",
    ("members", None, None): "members__scim_id",
    ("members", "value", None): "members__scim_id",
}


class FilterRefused(ValueError):
    pass


class _StrictTranspiler(Transpiler):
    def visit_AttrPath(self, node):
        mapped = super().visit_AttrPath(node)
        if mapped is None:
            name = node.attr_name if isinstance(node.attr_name, str) else "?"
            if node.sub_attr is not None:
                name = f"{name}.{node.sub_attr.value}"
            raise FilterRefused(f"Filtering on {name!r} is not supported.")
        return mapped


def _depth(text: str) -> int:
    depth = deepest = 0
    quoted = False
    for char in text:
        if char == '"':
            quoted = not quoted
        elif not quoted and char in "([":
            depth += 1
            deepest = max(deepest, depth)
        elif not quoted and char in ")]":
            depth -= 1
    return deepest


def _query(text: str, attr_map: dict):
    limit = settings.SCIM_FILTER_MAX_LENGTH
    if len(text) > limit:
        raise FilterRefused(
            f"The filter is {len(text)} characters long; at most {limit} (SCIM_FILTER_MAX_LENGTH)."
        )
    if _depth(text) > MAX_DEPTH:
        raise FilterRefused(f"The filter nests deeper than {MAX_DEPTH} levels.")
    try:
        tree = SCIMParser().parse(SCIMLexer().tokenize(text))
        query = _StrictTranspiler(attr_map).transpile(tree)
    except FilterRefused:
        raise
    except (RecursionError, Exception) as error:  # the parser raises several kinds
        raise FilterRefused(f"The filter does not parse: {str(error)[:200]}") from None
    if query is None:
        raise FilterRefused("The filter selects nothing this server can compare.")
    return query


class UserFilterQuery:
    attr_map = USER_ATTRIBUTES

    @classmethod
    def search(cls, filter_query: str, request=None):
        return ScimUser.objects.filter(_query(filter_query, cls.attr_map)).distinct()


class GroupFilterQuery:
    attr_map = GROUP_ATTRIBUTES

    @classmethod
    def search(cls, filter_query: str, request=None):
        return ScimGroup.objects.filter(_query(filter_query, cls.attr_map)).distinct()
