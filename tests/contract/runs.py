"""How the contract tier runs schemathesis: its command, the seed and sizes,
and who it runs as (CALLERS). Each caller's run is a test file of its own
(test_openapi_contract*.py), so the suite's workers take them side by side
(scripts/test_runs.sh, --dist loadfile)."""

from __future__ import annotations

import secrets
import subprocess
import sys
import time
from pathlib import Path

from django.test import Client

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


def check_the_contract_as(who: str, cast: dict, url: str, tmp_path: Path) -> None:
    """Runs schemathesis over every operation as `who` (a key of CALLERS) and
    fails with its report if any check failed."""
    auth = CALLERS[who](cast)

    code, output, seconds = run_schemathesis(url, auth, tmp_path / "junit.xml")

    summary = output[output.find("SUMMARY") :] if "SUMMARY" in output else output[-4000:]
    print(f"{who}: schemathesis ran {seconds:.0f} s\n{summary}")  # shown with -rP
    assert code == 0, f"schemathesis found contract failures ({seconds:.0f} s):\n{output[-30000:]}"
    assert "Tested: " in summary, summary
