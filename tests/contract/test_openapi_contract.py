"""The OpenAPI contract is exact: schemathesis (`--checks all`) over every
operation of /api/schema/, against a live server this test starts, as a member's
pipeline token; test_openapi_contract_admin_session.py and
test_openapi_contract_service_account.py run it as the other callers of
CALLERS (tests/contract/runs.py), a file each so the suite's workers take
them side by side.

Training pipelines generate their clients from the schema, so every status,
content type and body an operation can answer must be in it, and every
request the schema allows must be accepted (or refused with a documented
status). The exceptions the schema cannot express are in schemathesis.toml
next to this file, each with its reason.

The admin's session is a real session row and the CSRF pair Django expects:
the `csrftoken` cookie and the same value in `X-CSRFToken`, sent as static
headers on every request, so unsafe methods pass DRF's CSRF check exactly as
the browser UI's htmx requests do.
"""

from __future__ import annotations

import pytest

from tests.contract.runs import check_the_contract_as

# reset_sequences: every caller's run finds the cast under the same ids, the
# ones schemathesis.toml's dictionaries name.
pytestmark = [pytest.mark.contract, pytest.mark.django_db(transaction=True, reset_sequences=True)]


def test_every_operation_keeps_the_contract_as_a_member(cast, live_server, tmp_path):
    check_the_contract_as("member_token", cast, live_server.url, tmp_path)
