"""`lora-registry webhook verify` agrees with the signatures the registry sends
(notifications/signing.py), refuses a changed body, another secret and an old
timestamp, and calls no registry."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from notifications.signing import sign

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "python"
SECRET = "whsec_test-secret"
BODY = b'{"id":"6a4f","type":"version.approved"}'


def run(*args: str, body: bytes = BODY, env: dict | None = None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LORA_REGISTRY")}
    # This checkout's client, whichever copy the virtualenv installed.
    environment["PYTHONPATH"] = str(CLIENT)
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "lora_registry_client.cli", "webhook", "verify", *args],
        input=body,
        capture_output=True,
        env=environment,
        timeout=60,
    )


def test_a_signature_the_registry_made_is_valid():
    done = run("--secret", SECRET, "--signature", sign(SECRET, BODY))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == b"valid"


def test_the_secret_may_come_from_the_environment_and_the_body_from_a_file(tmp_path):
    path = tmp_path / "body.json"
    path.write_bytes(BODY)
    done = run(
        "--signature",
        sign(SECRET, BODY),
        "--body",
        str(path),
        body=b"",
        env={"LORA_REGISTRY_WEBHOOK_SECRET": SECRET},
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("secret", "body", "timestamp"),
    [
        ("whsec_another", BODY, None),
        (SECRET, BODY.replace(b"approved", b"refused"), None),
        (SECRET, BODY, int(time.time()) - 3600),
    ],
    ids=["another secret", "a changed body", "an hour old"],
)
def test_a_signature_that_does_not_hold_is_refused_with_exit_3(secret, body, timestamp):
    header = sign(secret, BODY, timestamp)
    done = run("--secret", SECRET, "--signature", header, body=body)
    assert done.returncode == 3, done.stdout
    assert b"invalid" in done.stderr


def test_without_a_secret_it_is_a_usage_error():
    done = run("--signature", sign(SECRET, BODY))
    assert done.returncode == 2
