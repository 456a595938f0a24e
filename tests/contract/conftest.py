"""The contract tier's cast: the rows every caller's schemathesis run meets
(tests/contract/schemathesis.toml's dictionaries name them by id)."""

from __future__ import annotations

import pytest

from core.models import Ability
from core.services.service_accounts import service_account_create, service_account_token_create
from core.services.tokens import token_create
from registry.models import VersionStatus
from registry.services.versions import version_transition
from serving.services.deployments import deployment_create
from tests.conftest import actor
from tests.factories import make_adapter, make_approved_version, make_version
from tests.support.adapters import AdapterSpec


@pytest.fixture
def cast(legal, finance, lena, alex, fred, root, legal_token, settings, tmp_path):
    # MLflow stays off (documented 503); S3 registration gets a refused loopback
    # port, so an s3_uri answers at once (503 s3_unavailable), never the internet.
    settings.MLFLOW_TRACKING_URI = ""
    settings.ARTIFACT_S3 = {**settings.ARTIFACT_S3, "endpoint_url": "http://127.0.0.1:9"}
    contracts = make_adapter(lena, legal, name="contracts")
    make_version(lena, contracts, AdapterSpec(seed=1))
    pending = make_version(lena, contracts, AdapterSpec(seed=2))
    version_transition(actor=actor(lena), version=pending, action="submit")
    make_approved_version(lena, alex, contracts, AdapterSpec(seed=3))
    make_adapter(fred, finance, name="invoices")
    make_adapter(lena, legal, name="clauses")
    assert contracts.versions.filter(status=VersionStatus.APPROVED).exists()
    # The member's own token is id 1, which the toml's dictionaries leave out
    # (revoking it would end the run); 2 is legal's, 3 finance's.
    assert legal_token.pk == 1
    for department, owner in ((legal, lena), (finance, fred)):
        token_create(
            actor=actor(owner),
            department=department,
            name="other",
            abilities=[Ability.REGISTER_VERSIONS],
        )
    # One deployment legal may use (members read its summary) and one it may
    # not (a 404 for them); their replica is a refused loopback port.
    for name, department in (("legal-cpu", legal), ("finance-cpu", finance)):
        deployment = deployment_create(
            actor=actor(root),
            name=name,
            environment="staging",
            base_model_name="tiny-llama",
            replica_urls=["http://127.0.0.1:9"],
            volume_write_path=str(tmp_path / name),
            volume_serve_path=str(tmp_path / name),
        )
        deployment.allowed_departments.set([department])
    # A pipeline that is not a person: legal's approver makes the account and
    # mints its token (id 4, after the cast's three; the dictionaries leave it
    # out, so the run never revokes its own credentials).
    account = service_account_create(actor=actor(alex), department=legal, name="nightly")
    service_token, service_secret = service_account_token_create(
        actor=actor(alex), account=account, name="ci", abilities=list(Ability.values)
    )
    assert service_token.pk == 4
    return {"token": legal_token.secret, "root": root, "service_token": service_secret}
