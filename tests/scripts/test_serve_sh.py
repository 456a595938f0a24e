"""scripts/vllm/serve.sh, the command of the compose file's CPU replicas: the
API key comes from a secret file, reaches vLLM as VLLM_API_KEY and never its
command line. A stand-in for the venv's python shows what vLLM would get."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def serve(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(
        "#!/bin/sh\n"
        'echo "key=${VLLM_API_KEY:-}"\n'
        'echo "otel=${OTEL_EXPORTER_OTLP_TRACES_PROTOCOL:-}|'
        '${OTEL_EXPORTER_OTLP_TRACES_HEADERS:-}"\n'
        'echo "args=$*"\n'
    )
    python.chmod(0o755)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    return subprocess.run(
        ["bash", str(REPO / "scripts/vllm/serve.sh"), "--model", str(model)],
        env={"PATH": os.environ["PATH"], "VLLM_VENV": str(venv), **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_the_key_comes_from_the_secret_file_and_never_onto_the_command_line(tmp_path):
    key_file = tmp_path / "vllm_api_key"
    key_file.write_text("replica-key-from-a-file\n")
    result = serve(tmp_path, SERVE_API_KEY_FILE=str(key_file))
    assert result.returncode == 0, result.stderr
    assert "key=replica-key-from-a-file\n" in result.stdout
    assert "replica-key-from-a-file" not in result.stdout.split("args=")[1]
    assert "api_key=set" in result.stdout + result.stderr


def test_an_empty_key_file_stops_it(tmp_path):
    key_file = tmp_path / "vllm_api_key"
    key_file.write_text("")
    result = serve(tmp_path, SERVE_API_KEY_FILE=str(key_file))
    assert result.returncode == 2
    assert "is empty" in result.stderr
    assert "key=" not in result.stdout


def test_every_stream_ends_with_usage(tmp_path):
    result = serve(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "--enable-force-include-usage" in result.stdout
    assert "--otlp-traces-endpoint" not in result.stdout


def test_metering_sends_spans_over_otlp_http_with_the_token_from_a_file(tmp_path):
    token_file = tmp_path / "metering_token"
    token_file.write_text("metering-token-from-a-file\n")
    endpoint = "http://control-plane:8000/otlp/prod/v1/traces"
    result = serve(
        tmp_path, SERVE_OTLP_TRACES_ENDPOINT=endpoint, SERVE_OTLP_TOKEN_FILE=str(token_file)
    )
    assert result.returncode == 0, result.stderr
    args = result.stdout.split("args=")[1]
    assert f"--otlp-traces-endpoint {endpoint}" in args
    assert "metering-token-from-a-file" not in args
    # What vLLM's exporter reads: OTLP/HTTP (its default is gRPC) and the header.
    assert "otel=http/protobuf|authorization=Bearer%20metering-token-from-a-file\n" in (
        result.stdout
    )
