"""A real S3 API over HTTP on loopback, for tests and benchmarks.

`moto.server` runs in its own process, so clients talk to it exactly as they
would to MinIO or AWS: signed HTTP requests over a socket, no in-process mocking.
Objects live in that process's memory, which keeps the client's memory figures
honest in benchmarks.

    with running_s3_server() as endpoint:
        make_bucket(endpoint, "adapters")
"""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.process_start import NotStarted, wait_until_started

ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"

# A proxy from the environment must never sit between a client and loopback.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(endpoint: str) -> bool:
    try:
        with _NO_PROXY.open(endpoint + "/moto-api/", timeout=1):
            return True
    except urllib.error.HTTPError:
        return True  # any HTTP answer means it is serving
    except OSError:
        return False


@contextmanager
def running_s3_server(*, startup_cpu_seconds: float = 30) -> Iterator[str]:
    """Start `python -m moto.server` on a free loopback port; yield its endpoint URL."""
    env = dict(os.environ)
    env.setdefault("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    env.setdefault("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    env.setdefault("AWS_DEFAULT_REGION", REGION)
    with tempfile.TemporaryDirectory(prefix="moto-") as tmp:
        log = Path(tmp, "server.log")
        # free_port() can race with another process grabbing the port; retry then.
        for attempt in range(3):
            port = free_port()
            endpoint = f"http://127.0.0.1:{port}"
            with open(log, "wb") as out:
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "moto.server",
                        "-H",
                        "127.0.0.1",
                        "-p",
                        str(port),
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                )
            try:
                wait_until_started(
                    proc,
                    functools.partial(_answers, endpoint),
                    what=f"moto server at {endpoint}",
                    log=log,
                    cpu_seconds=startup_cpu_seconds,
                )
                break
            except NotStarted:
                _stop(proc)
                if attempt == 2:
                    raise
        try:
            yield endpoint
        finally:
            _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def s3_client(endpoint: str, *, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY):
    """A plain boto3 client for `endpoint`, by default with the dummy credentials."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name=REGION,
        config=Config(
            s3={"addressing_style": "path"},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
    )


def make_bucket(endpoint: str, name: str) -> None:
    s3_client(endpoint).create_bucket(Bucket=name)


def store_options(endpoint: str) -> dict:
    """S3ArtifactStore / build_artifact_store keyword arguments for `endpoint`."""
    return {
        "endpoint_url": endpoint,
        "region": REGION,
        "access_key": ACCESS_KEY,
        "secret_key": SECRET_KEY,
        "addressing_style": "path",
    }
