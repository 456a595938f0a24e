"""The OpenAPI contract is exact: schemathesis (`--checks all`) over every
operation of /api/schema/, against a live server this test starts, once per
caller in CALLERS (a member's pipeline token, a platform admin's session,
a department's service account's token).

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

import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.test import Client

from core.models import Ability
from core.services.service_accounts import service_account_create, service_account_token_create
from core.services.tokens import token_create
from registry.models import VersionStatus
from registry.services.versions import version_transition
from serving.services.deployments import deployment_create
from tests.conftest import actor
from tests.factories import make_adapter, make_approved_version, make_version
from tests.support.adapters import AdapterSpec

# reset_sequences: every caller's run finds the cast under the same ids, the
# ones schemathesis.toml's dictionaries name.
pytestmark = [pytest.mark.contract, pytest.mark.django_db(transaction=True, reset_sequences=True)]

HERE = Path(__file__).resolve().parent
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
# 30 examples per operation, then the stateful phase (sequences that follow the
# schema's links). The seed fixes the examples drawn, so a run is reproducible
# with the command it prints; the price is that every run asks the same
# questions, which a changed schema (or a changed seed) varies.
MAX_EXAMPLES = 30
SEED = 14
# schemathesis' coverage phase (every boundary and wrong type of every
# parameter) runs in tests/contract/test_coverage_phase.py, its positive cases
# as a member; the whole phase (~4,400 cases, ~5 minutes per caller) by hand:
#   schemathesis --config-file tests/contract/schemathesis.toml run \
#     <url>/api/schema/ --checks all -H "Authorization: Bearer <token>"
PHASES = "examples,fuzzing,stateful"


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


def bearer(token: str) -> list[str]:
    return ["-H", f"Authorization: Bearer {token}"]


def admin_session_headers(root) -> list[str]:
    client = Client()
    client.force_login(root)
    session = client.cookies["sessionid"].value
    csrf = secrets.token_hex(16)  # Django's unmasked 32-character secret
    return [
        "-H",
        f"Cookie: sessionid={session}; csrftoken={csrf}",
        "-H",
        f"X-CSRFToken: {csrf}",
        # ignored_auth replaces the credentials it knows with invalid ones, but a
        # session given as a static Cookie header stays valid, so the check would
        # only report its own setup. The token run checks that invalid
        # credentials are refused (and a valid session under a bad Authorization
        # header is refused: tests/registry/api/test_schema_is_true.py).
        "--exclude-checks",
        "ignored_auth",
    ]


# Who the contract is checked as: a name, and the schemathesis arguments that
# authenticate as them, from the cast. One line per caller.
CALLERS = {
    "member_token": lambda cast: bearer(cast["token"]),
    "admin_session": lambda cast: admin_session_headers(cast["root"]),
    "service_account_token": lambda cast: bearer(cast["service_token"]),
}


def run_schemathesis(url: str, auth: list[str], report: Path) -> tuple[int, str, float]:
    started = time.monotonic()
    done = subprocess.run(
        [
            str(SCHEMATHESIS),
            "--config-file",
            str(HERE / "schemathesis.toml"),
            "--no-color",
            "run",
            f"{url}/api/schema/",
            "--checks",
            "all",
            *auth,
            "--max-examples",
            str(MAX_EXAMPLES),
            "--seed",
            str(SEED),
            "--phases",
            PHASES,
            "--workers",
            "2",
            "--request-timeout",
            "20",
            "--report",
            "junit",
            "--report-junit-path",
            str(report),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=report.parent,  # its crash cache (.schemathesis/) stays out of the checkout
    )
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


@pytest.mark.parametrize("who", CALLERS)
def test_every_operation_keeps_the_openapi_contract(who, cast, live_server, tmp_path):
    auth = CALLERS[who](cast)

    code, output, seconds = run_schemathesis(live_server.url, auth, tmp_path / "junit.xml")

    summary = output[output.find("SUMMARY") :] if "SUMMARY" in output else output[-4000:]
    print(f"{who}: schemathesis ran {seconds:.0f} s\n{summary}")  # shown with -rP
    assert code == 0, f"schemathesis found contract failures ({seconds:.0f} s):\n{output[-30000:]}"
    assert "Tested: " in summary, summary
