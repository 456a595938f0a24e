"""A string field takes a JSON string and nothing else.

DRF's CharField (and every field built on it: SlugField, RegexField, EmailField,
URLField, ...) turns a JSON number into its text, so
`{"name": 42}` is accepted although the OpenAPI schema says `type: string`;
schemathesis finds it, and a pipeline that sends the wrong type never learns.
Form and multipart bodies carry only strings, so refusing other types changes
nothing for them. DRF has no setting for this, hence one wrapper, applied once
from CoreConfig.ready().
"""

from __future__ import annotations

from rest_framework import fields
from rest_framework.exceptions import ValidationError

_original = fields.CharField.to_internal_value


def _strings_only(self, data):
    if isinstance(data, (int, float)) and not isinstance(data, bool):
        # Booleans, arrays and objects DRF already refuses ("Not a valid string.").
        raise ValidationError("Must be a string, not a JSON number.", code="invalid")
    return _original(self, data)


def install() -> None:
    if getattr(fields.CharField.to_internal_value, "strings_only", False):
        return
    setattr(_strings_only, "strings_only", True)  # noqa: B010 - a marker mypy cannot see on a function
    # Replacing DRF's method is the point: every CharField refuses JSON numbers.
    fields.CharField.to_internal_value = _strings_only  # type: ignore[method-assign]
