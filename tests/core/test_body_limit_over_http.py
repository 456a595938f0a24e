"""An oversized body is a 413 with the product's error body under both web
servers the product runs with (issue 34): Django's development server as
`make run` starts it, and gunicorn as the image starts it, each in its own
process, over a real socket.

The client announces 1 GiB, sends its headers and 1 KiB of the body, then
sends nothing more and reads. The answer and the server's close must both come
while the client has sent that KiB: a server that wanted the rest (Django's
development server read all of it, after answering, to keep the connection)
never closes, and one that answered `Connection: close` from the application
gave a 500 (wsgiref refuses hop-by-hop headers from the application).
"""

from __future__ import annotations

import http.client
import io
import json
import socket
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.support.web_server import registry_web_server

GIB = 1024**3
SENT_BODY = 1024
# The answer comes from the headers; the close right after it.
CLOSE_WITHIN_SECONDS = 5

REQUESTS = {
    "multipart sign-in": (
        "/login/",
        "multipart/form-data; boundary=xyz",
        b'--xyz\r\nContent-Disposition: form-data; name="f"; filename="a.bin"\r\n\r\n',
    ),
    "form sign-in": ("/login/", "application/x-www-form-urlencoded", b"username="),
    "API adapter create": ("/api/v1/adapters/", "application/json", b'{"name": "'),
}


@pytest.fixture(scope="module", params=["runserver", "gunicorn"])
def server(request, tmp_path_factory):
    with registry_web_server(tmp_path_factory.mktemp("web"), server=request.param) as (url, _):
        yield url


class _Received:
    """What the client read, as the socket http.client.HTTPResponse parses."""

    def __init__(self, data: bytes):
        self.data = data

    def makefile(self, *args, **kwargs):
        return io.BytesIO(self.data)


def send_little_and_read(url: str, path: str, content_type: str, start: bytes):
    """Announces 1 GiB, sends SENT_BODY bytes of it, then only reads.
    Returns the parsed answer, its body, and whether the server closed."""
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=CLOSE_WITHIN_SECONDS)
    try:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {GIB}\r\n\r\n".encode()
            + start.ljust(SENT_BODY, b"a")
        )
        received, closed = b"", False
        try:
            while chunk := sock.recv(65536):
                received += chunk
            closed = True
        except TimeoutError:
            pass
    finally:
        sock.close()
    answer = http.client.HTTPResponse(_Received(received))
    answer.begin()
    return answer, answer.read(), closed


def test_make_run_serves_with_the_development_server_started_here():
    run = (Path(__file__).resolve().parents[2] / "scripts" / "run.sh").read_text()
    assert 'manage.py runserver --noreload 127.0.0.1:$PORT"' in run
    assert 'DJANGO_DEBUG="${DJANGO_DEBUG:-false}"' in run


@pytest.mark.parametrize("name", ["multipart sign-in", "form sign-in"])
def test_an_anonymous_gigabyte_sign_in_is_413_and_closed_after_a_kilobyte(server, name):
    answer, body, closed = send_little_and_read(server, *REQUESTS[name])
    assert answer.status == 413, body[:500]
    assert answer.getheader("Content-Type").startswith("text/plain")
    assert b"DATA_UPLOAD_MAX_MEMORY_SIZE" in body, body[:500]
    assert closed, "the server kept the connection open, waiting for the body"


def test_a_gigabyte_api_request_gets_the_api_error_and_is_closed_after_a_kilobyte(server):
    answer, body, closed = send_little_and_read(server, *REQUESTS["API adapter create"])
    assert answer.status == 413, body[:500]
    error = json.loads(body)["error"]
    assert error["status"] == 413 and error["code"] == "request_too_large"
    assert error["request_id"] == answer.getheader("X-Request-ID")
    assert closed, "the server kept the connection open, waiting for the body"
