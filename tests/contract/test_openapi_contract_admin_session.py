"""The OpenAPI contract as a platform admin's session (with its CSRF pair):
the run of test_openapi_contract.py, whose docstring says what it checks."""

from __future__ import annotations

import pytest

from tests.contract.runs import check_the_contract_as

# reset_sequences: every caller's run finds the cast under the same ids, the
# ones schemathesis.toml's dictionaries name.
pytestmark = [pytest.mark.contract, pytest.mark.django_db(transaction=True, reset_sequences=True)]


def test_every_operation_keeps_the_contract_as_an_admin_session(cast, live_server, tmp_path):
    check_the_contract_as("admin_session", cast, live_server.url, tmp_path)
