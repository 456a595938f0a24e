"""`runserver` (what `make run` serves with), closing the connection on a
request body the application leaves unread instead of reading all of it.

Django's development server keeps every connection open for the next request,
so after answering it reads whatever the application left of the body
(`basehttp.ServerHandler.close`: one read of the rest of the declared
Content-Length). A body refused unread (core/body_limit.py: a 413 for a
declared 1 GiB) would then be read in full into one buffer, and a client that
sends nothing more waits on a connection that never closes. The application
cannot say "close" itself: PEP 3333 leaves hop-by-hop headers to the server,
and wsgiref refuses them with an AssertionError (a 500).

Here the server says it, as gunicorn does (its sync worker closes every
connection and reads at most 64 KiB, for at most 2 s, before the close:
`gunicorn.util.close_graceful`): `Connection: close` on the answer, the write
side shut, then a short bounded linger so that the close does not reset the
connection before the client has read the answer (RFC 9112 §9.6).
"""

from __future__ import annotations

import socket
import time
from wsgiref import simple_server

from django.contrib.staticfiles.management.commands.runserver import Command as StaticRunserver
from django.core.servers import basehttp

LINGER_SECONDS = 2.0
LINGER_BYTES = 64 * 1024


class _CountedBody:
    """The socket's reader, counting the body bytes taken from it."""

    def __init__(self, stream):
        self.stream = stream
        self.taken = 0

    def read(self, size=-1, /):
        data = self.stream.read(size)
        self.taken += len(data)
        return data

    def readline(self, size=-1, /):
        line = self.stream.readline(size)
        self.taken += len(line)
        return line


class _ServerHandler(basehttp.ServerHandler):
    def __init__(self, stdin, stdout, stderr, environ, **kwargs):
        try:
            self.declared = int(environ.get("CONTENT_LENGTH"))
        except (TypeError, ValueError):
            self.declared = 0
        self.body = _CountedBody(stdin)
        super().__init__(self.body, stdout, stderr, environ, **kwargs)

    def cleanup_headers(self):
        super().cleanup_headers()
        if self.body.taken < self.declared:
            self.headers["Connection"] = "close"
            self.request_handler.close_connection = True
            self.request_handler.body_left = True

    def close(self):
        if self.request_handler.body_left:
            # Not Django's close, which would read the rest of the body first.
            simple_server.ServerHandler.close(self)
        else:
            super().close()


class _RequestHandler(basehttp.WSGIRequestHandler):
    body_left = False

    def handle(self):
        super().handle()  # ends by shutting the write side: the client has the answer
        if self.body_left:
            _linger(self.connection)

    def handle_one_request(self):
        # Django's, with the handler above in place of basehttp.ServerHandler.
        self.raw_requestline = self.rfile.readline(65537)
        if len(self.raw_requestline) > 65536:
            self.requestline = ""
            self.request_version = ""
            self.command = ""
            self.send_error(414)
            return
        if not self.parse_request():
            return
        handler = _ServerHandler(self.rfile, self.wfile, self.get_stderr(), self.get_environ())
        handler.request_handler = self
        handler.run(self.server.get_app())


def _linger(sock: socket.socket) -> None:
    """Reads and drops what the client still sends, for a moment: closing a
    socket with unread data resets the connection, and the reset can take the
    answer with it before the client has read it."""
    deadline = time.monotonic() + LINGER_SECONDS
    taken = 0
    while taken < LINGER_BYTES and (left := deadline - time.monotonic()) > 0:
        try:
            sock.settimeout(left)
            data = sock.recv(16 * 1024)
        except OSError:  # a timeout included
            return
        if not data:
            return
        taken += len(data)


class _Server(basehttp.WSGIServer):
    def __init__(self, server_address, _handler_class, **kwargs):
        # basehttp.run() passes its own WSGIRequestHandler; there is no setting for it.
        super().__init__(server_address, _RequestHandler, **kwargs)


class Command(StaticRunserver):
    server_cls = _Server
