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
    python.write_text('#!/bin/sh\necho "key=${VLLM_API_KEY:-}"\necho "args=$*"\n')
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
