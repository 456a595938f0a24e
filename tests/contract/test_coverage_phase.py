"""schemathesis' coverage phase in the contract tier, within its time budget.

The coverage phase sends, for every operation, the schema's boundary cases:
each parameter and body property at its bounds, each enum value, the
smallest and largest strings and arrays the schema allows, optional fields
present and absent (positive), and past the bounds, wrong types, missing
required fields (negative), plus every HTTP method a path does not define.
Without those methods, it is ~4,200 cases and ~3.5 minutes per caller on this
machine, past what `make test` can spend (issue 28).

Run here (measured: 1,357 cases, 115-165 s of schemathesis, 0 failures), and what it leaves
(docs/internals/testing.md):
- the positive cases only: every boundary value the schema allows must be
  accepted or refused with a documented status (positive_data_acceptance and
  every other check, with schemathesis.toml's exceptions). The negative ones
  (wrong types, values past a bound) are what the fuzzing phase of
  test_openapi_contract.py sends at random;
- one caller, a member's token; the admin's session and the service account
  are checked at their boundaries only by the full command below;
- no unexpected-method cases (`unexpected-methods = []`): a path's 405 for a
  method it does not define is Django's, the same for every view.

The full phase, before a release:
    schemathesis --config-file tests/contract/schemathesis.toml run \\
      <url>/api/schema/ --phases coverage --checks all -H "Authorization: Bearer <token>"
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest

from tests.contract.runs import HERE, SCHEMATHESIS, SEED, bearer

pytestmark = [pytest.mark.contract, pytest.mark.django_db(transaction=True, reset_sequences=True)]

# Appended to schemathesis.toml, whose exceptions stay the one list.
BOUNDS = """
[phases.coverage]
unexpected-methods = []
"""


def test_the_schemas_boundary_cases_keep_the_contract(cast, live_server, tmp_path):
    config = tmp_path / "schemathesis.toml"
    config.write_text((HERE / "schemathesis.toml").read_text() + BOUNDS)
    started = time.monotonic()
    done = subprocess.run(
        [
            str(SCHEMATHESIS),
            "--config-file",
            str(config),
            "--no-color",
            "run",
            f"{live_server.url}/api/schema/",
            "--checks",
            "all",
            *bearer(cast["token"]),
            "--phases",
            "coverage",
            "--mode",
            "positive",
            "--seed",
            str(SEED),
            # One: two threads generating at once hit CPython 3.11's "AST
            # constructor recursion depth mismatch" in hypothesis (a runtime error,
            # not a finding); two were no faster on this 2-core machine.
            "--workers",
            "1",
            "--request-timeout",
            "20",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,  # its crash cache (.schemathesis/) stays out of the checkout
    )
    seconds = time.monotonic() - started
    output = done.stdout + done.stderr
    summary = output[output.find("SUMMARY") :] if "SUMMARY" in output else output[-4000:]
    print(f"coverage phase: {seconds:.0f} s\n{summary}")  # shown with -rP
    assert done.returncode == 0, f"contract failures ({seconds:.0f} s):\n{output[-30000:]}"
    # The coverage phase ran, over every operation, and every case it made passed.
    assert "✅ Coverage" in summary, summary
    assert "Tested: " in summary, summary
    cases = re.search(r"(\d+) generated, (\d+) passed", summary)
    assert cases and cases[1] == cases[2] and int(cases[1]) > 1000, summary
