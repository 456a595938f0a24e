"""No body before identity (issue 21, item 4), against gunicorn in its own process.

An anonymous multipart POST announcing 1 GiB is answered after its headers:
/login/ keeps Django's small limit (413), and the ingest endpoints, which take
large bodies, first want to know who is calling (401, or the sign-in page).
The client sends the headers and the file part's own header, then waits for
the answer before sending one byte of the file.
"""

from __future__ import annotations

import selectors
import socket
from urllib.parse import urlsplit

import pytest

from tests.support.web_server import registry_web_server

GIB = 1024**3
CHUNK = 64 * 1024
# Well past the small limit (10 MiB): a server still reading at this point read the body.
GIVE_UP_AFTER = 32 * 1024**2
# The refusal comes from the headers alone; a server that waits for the body does not answer.
ANSWER_WITHIN_SECONDS = 5

SETUP = """
from django.contrib.auth import get_user_model
from core.actors import Actor
from core.models import Department, Membership, Role
from registry.services.adapters import adapter_create
department = Department.objects.create(slug="legal", name="Legal")
user = get_user_model().objects.create_user(username="lena")
Membership.objects.create(user=user, department=department, role=Role.MEMBER)
adapter = adapter_create(actor=Actor(user=user), department=department, name="contracts",
                         base_model="tiny-llama")
print(adapter.pk)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with registry_web_server(tmp_path_factory.mktemp("web"), SETUP) as (url, output):
        yield url, output.split()[-1]


def post_until_answered(url: str, path: str) -> tuple[bytes, int]:
    """POSTs a multipart body announced as 1 GiB and waits for the answer before
    sending any of the file's bytes; then keeps sending (a server still reading
    answers only once it has what it wants). Returns the answer and how many
    body bytes had been sent when it came."""
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        "Content-Type: multipart/form-data; boundary=xyz\r\n"
        f"Content-Length: {GIB}\r\n\r\n"
        '--xyz\r\nContent-Disposition: form-data; name="files"; filename="a.bin"\r\n\r\n'
    ).encode()
    sock.sendall(head)
    sent, filler = 0, b"\0" * CHUNK
    # selectors, not select.select: late in a full run the socket's descriptor can be
    # above 1024, which select() refuses ("filedescriptor out of range").
    watch = selectors.DefaultSelector()
    watch.register(sock, selectors.EVENT_READ)
    try:
        if _ready(watch, ANSWER_WITHIN_SECONDS):
            return _read_answer(sock), sent
        watch.modify(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
        while sent < GIVE_UP_AFTER:
            events = _ready(watch, 5)
            if events & selectors.EVENT_READ:
                break
            if events & selectors.EVENT_WRITE:
                try:
                    sent += sock.send(filler)
                except (BrokenPipeError, ConnectionResetError):
                    break  # closed on us: the answer, if any, is waiting
        return _read_answer(sock), sent
    finally:
        watch.close()
        sock.close()


def _ready(watch: selectors.BaseSelector, timeout: float) -> int:
    """The registered events the socket is ready for within `timeout` (0: none)."""
    mask = 0
    for _key, events in watch.select(timeout):
        mask |= events
    return mask


def _read_answer(sock: socket.socket) -> bytes:
    """The answer up to the server's close (it must close: the body is unread)."""
    sock.settimeout(5)
    answer = b""
    try:
        while chunk := sock.recv(65536):
            answer += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return answer


def test_an_anonymous_gigabyte_post_to_login_is_refused_before_it_is_read(server):
    url, _ = server
    answer, sent = post_until_answered(url, "/login/")
    assert answer.startswith(b"HTTP/1.1 413"), (answer[:200], sent)
    assert b"DATA_UPLOAD_MAX_MEMORY_SIZE" in answer
    assert sent == 0, sent


def test_the_api_ingest_endpoint_wants_a_caller_before_the_body(server):
    url, adapter_id = server
    answer, sent = post_until_answered(url, f"/api/v1/adapters/{adapter_id}/versions/")
    assert answer.startswith(b"HTTP/1.1 401"), (answer[:200], sent)
    assert sent == 0, sent


def test_the_web_upload_sends_an_anonymous_caller_to_sign_in_before_the_body(server):
    url, adapter_id = server
    answer, sent = post_until_answered(url, f"/adapters/{adapter_id}/versions/")
    assert answer.startswith(b"HTTP/1.1 302"), (answer[:200], sent)
    assert b"/login/" in answer
    assert sent == 0, sent
