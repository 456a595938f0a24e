"""The OpenAPI schema documents every answer an operation can give, errors included.

Training pipelines generate clients from /api/schema/, so an undocumented 4xx
is a client that cannot parse the error (schemathesis found 72 of them: no
operation documented the error envelope). `ApiAutoSchema` adds the one error
envelope (core.api.errors) to each operation for the statuses its kind can
return; a view names the extra ones its work can cause in `error_statuses`
(per action name, or "*" for all of its operations).
"""

from __future__ import annotations

from drf_spectacular.openapi import AutoSchema
from rest_framework import serializers
from rest_framework.permissions import AllowAny

ERROR_DESCRIPTIONS = {
    400: "Invalid request: a field, query parameter or artifact was refused (`code` says which).",
    401: "No valid credentials (missing, unknown, expired or revoked token).",
    403: "Authenticated, but not allowed (role, token ability or four-eyes rule).",
    404: "Not found, or outside your departments.",
    409: "Conflicts with the current state (e.g. an invalid transition, a duplicate).",
    413: "Too large (an upload over INGEST_MAX_BYTES, or too many entries).",
    415: "Unsupported media type or upload type.",
    422: "The compatibility gate refused the version for the deployment (`details.checks`).",
    429: "Too many refused requests from this address; `Retry-After` says when to try again.",
    503: "A dependency (artifact store, MLflow) is unavailable or not configured.",
}
UNSAFE = {"POST", "PUT", "PATCH", "DELETE"}


class ErrorDetailSerializer(serializers.Serializer):
    status = serializers.IntegerField()
    code = serializers.CharField(help_text="Stable snake_case code clients can branch on.")
    message = serializers.CharField()
    details = serializers.DictField(child=serializers.JSONField())
    request_id = serializers.CharField(allow_blank=True)


class ErrorEnvelopeSerializer(serializers.Serializer):
    """Every 4xx and 5xx of the API."""

    error = ErrorDetailSerializer()


# What a generated operation does, when its view has no docstring of its own:
# (HTTP method, whether the path names one object) -> a sentence's verb.
_FALLBACK_VERBS = {
    ("get", False): "Lists the {noun} the caller may see.",
    ("get", True): "One of the {noun}, if the caller may see it (404 otherwise).",
    ("post", False): "Creates one of the {noun}.",
    ("post", True): "Acts on one of the {noun}.",
    ("patch", True): "Changes fields of one of the {noun}.",
    ("put", True): "Replaces one of the {noun}.",
    ("delete", True): "Removes one of the {noun}.",
}


class ApiAutoSchema(AutoSchema):
    def get_tags(self):
        # Every path starts /api/v1/, so drf-spectacular's default (the first path
        # segment) put 83 operations under one tag, "api". Group them by the
        # resource instead; operation ids keep their full path (clients use them).
        parts = [p for p in self.path.strip("/").split("/") if p and not p.startswith("{")]
        if parts[:2] == ["api", "v1"] and len(parts) > 2:
            return [parts[2]]
        return ["health"] if parts and parts[0] in ("livez", "readyz") else parts[:1]

    def get_description(self):
        described = super().get_description()
        if described:
            return described
        # Nested resources (/adapters/{id}/versions/) are named by their last word.
        words = [p for p in self.path.strip("/").split("/") if p and not p.startswith("{")]
        noun = words[-1].replace("-", " ") if words else "objects"
        one = self.path.rstrip("/").endswith("}")
        template = _FALLBACK_VERBS.get((self.method.lower(), one), "Acts on the {noun}.")
        return template.format(noun=noun)

    def map_parsers(self):
        # Request bodies are documented as JSON. The parsers also take form and
        # multipart bodies (the browsable API, old scripts), but those cannot say
        # null, an empty list or a nested object, so a schema offering them would
        # offer requests it cannot keep. Uploads name their content types
        # explicitly (multipart for files, JSON for s3_uri).
        return ["application/json"]

    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        for code in sorted(self.error_statuses()):
            if str(code) in responses:
                continue
            response = self._get_response_for_code(
                ErrorEnvelopeSerializer, str(code), direction=direction
            )
            response["description"] = ERROR_DESCRIPTIONS[code]
            responses[str(code)] = response
        return responses

    def error_statuses(self) -> set[int]:
        codes: set[int] = set()
        permissions = getattr(self.view, "permission_classes", [])
        if not all(p is AllowAny for p in permissions):
            codes |= {401, 403}
        if "{" in self.path or self._is_paginated() or self.method in UNSAFE:
            # A list's page past the last one; a write's referenced object
            # (department, deployment, version) not found or out of reach.
            codes.add(404)
        if self.method in UNSAFE or self._has_query_parameters():
            codes.add(400)
        if self.method in UNSAFE:
            codes.add(409)
        if self.method in {"POST", "PUT", "PATCH"} and self.get_request_serializer() is not None:
            codes.add(415)  # DRF's parsers refuse other content types
        extra = getattr(self.view, "error_statuses", {})
        action = getattr(self.view, "action", None) or self.method.lower()
        codes |= set(extra.get("*", ())) | set(extra.get(action, ()))
        return codes

    def _is_paginated(self) -> bool:
        return (
            self.method == "GET"
            and self._is_list_view()
            and getattr(self.view, "pagination_class", None) is not None
        )

    def _has_query_parameters(self) -> bool:
        if self.method != "GET":
            return False
        if self._is_list_view() and (
            getattr(self.view, "pagination_class", None)
            or getattr(self.view, "filterset_class", None)
        ):
            return True
        return any(
            p.get("in") == "query"
            for p in self._get_parameters()  # extend_schema parameters, filters, pagination
        )


# Every DRF CharField (and django-filter's CharFilter) refuses "\x00" in a value;
# without this pattern the schema would call such strings valid. DRF also trims
# the ends before it checks a required text is not blank, so one that must not
# be empty must hold something other than whitespace.
NO_NUL = "^[^\\x00]*$"
NOT_BLANK = "^[^\\x00]*[^\\s\\x00][^\\x00]*$"


def _forbid_nul(schema) -> None:
    if isinstance(schema, list):
        for item in schema:
            _forbid_nul(item)
        return
    if not isinstance(schema, dict):
        return
    if schema.get("type") == "string" and not ({"pattern", "enum", "format"} & schema.keys()):
        schema["pattern"] = NOT_BLANK if schema.get("minLength", 0) >= 1 else NO_NUL
    for key in ("properties", "additionalProperties", "items", "allOf", "anyOf", "oneOf"):
        if key == "properties":
            for value in schema.get(key, {}).values():
                _forbid_nul(value)
        elif key in schema:
            _forbid_nul(schema[key])


def postprocess_forbid_nul(result, generator, request, public):
    """drf-spectacular postprocessing hook: the NUL rule on every string a
    request carries (request bodies' components, query parameters)."""
    for name, component in result.get("components", {}).get("schemas", {}).items():
        if name.endswith("Request"):  # COMPONENT_SPLIT_REQUEST: request-only components
            _forbid_nul(component)
    for item in result.get("paths", {}).values():
        for operation in item.values():
            for parameter in operation.get("parameters", []):
                # DRF's OrderingFilter ignores what it cannot order by, NUL included.
                if parameter.get("in") == "query" and parameter.get("name") != "ordering":
                    _forbid_nul(parameter.get("schema"))
    return result
