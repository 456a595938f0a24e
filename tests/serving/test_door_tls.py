"""TLS at the front door, on a REAL HAProxy in front of a stand-in replica,
with a CA this test makes (docs/door.md#tls): the official `openai` client
over HTTPS, HTTP/2 offered by ALPN, plain HTTP refused on the TLS port, and
a certificate with its key beside it (cert-manager's Secret, mounted as
two files) read as well as one PEM with both."""

from __future__ import annotations

import hashlib
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
import requests

from serving.door.callers import CallerKey, DoorAccess
from serving.door.haproxy import HAProxyFrontDoor
from serving.door.haproxy.config import render_config
from serving.door.routing import ReplicaView, routing_table
from tests.support.haproxy import needs_haproxy, running_haproxy
from tests.support.tls import Authority, make_authority
from tests.support.vllm_servers import free_port
from tests.support.vllm_standin import running_fleet

pytestmark = needs_haproxy

BASE = "tiny-llama"
KEY = "sk-legal-tls"


def access_table() -> DoorAccess:
    return DoorAccess(
        deployment="gw",
        keys={
            hashlib.sha256(KEY.encode()).hexdigest(): CallerKey(
                key_id=1, department="legal", expires_at=int(time.time()) + 3600
            )
        },
        allowed=frozenset({("legal", BASE)}),
    )


@dataclass
class Door:
    door: HAProxyFrontDoor
    authority: Authority

    @property
    def port(self) -> int:
        return int(self.door.listen.rsplit(":", 1)[1])


@pytest.fixture(scope="module")
def authority(tmp_path_factory) -> Authority:
    return make_authority(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module", params=["pem", "crt"])
def door(request, tmp_path_factory, authority) -> Iterator[Door]:
    """A door on one PEM, and one on a certificate with its key beside it."""
    directory = tmp_path_factory.mktemp("tls")
    certificate = authority.pem if request.param == "pem" else authority.crt
    with running_fleet(1) as fleet:
        table = routing_table(
            deployment="gw",
            base_model=BASE,
            replicas=[ReplicaView(1, fleet.urls[0], False, {})],
            served=[],
        )
        front = HAProxyFrontDoor(
            directory, listen=f"127.0.0.1:{free_port()}", certificate=str(certificate)
        )
        front.write(table)
        with running_haproxy(front, log=directory / "haproxy.log", access=access_table()):
            yield Door(front, authority)


def trusting(authority: Authority) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(authority.ca))


def test_the_openai_client_is_answered_over_https(door):
    client = openai.OpenAI(
        base_url=f"https://127.0.0.1:{door.port}/v1",
        api_key=KEY,
        max_retries=0,
        http_client=openai.DefaultHttpxClient(verify=trusting(door.authority)),
    )
    completion = client.completions.create(model=BASE, prompt="The contract says", max_tokens=1)
    assert completion.model == BASE
    assert completion.choices

    # A wrong key is refused over TLS as it is in clear.
    refused = openai.OpenAI(
        base_url=f"https://localhost:{door.port}/v1",
        api_key="sk-nobody",
        max_retries=0,
        http_client=openai.DefaultHttpxClient(verify=trusting(door.authority)),
    )
    with pytest.raises(openai.AuthenticationError):
        refused.completions.create(model=BASE, prompt="x", max_tokens=1)


def test_a_client_that_does_not_trust_the_ca_is_refused_the_handshake(door):
    client = openai.OpenAI(
        base_url=f"https://127.0.0.1:{door.port}/v1",
        api_key=KEY,
        max_retries=0,
        http_client=openai.DefaultHttpxClient(verify=ssl.create_default_context()),
    )
    with pytest.raises(openai.APIConnectionError):
        client.completions.create(model=BASE, prompt="x", max_tokens=1)


def negotiated(door: Door, offered: list[str]) -> tuple[str | None, str | None]:
    """(ALPN protocol, TLS version) of a handshake offering `offered`."""
    context = trusting(door.authority)
    context.set_alpn_protocols(offered)
    with (
        socket.create_connection(("127.0.0.1", door.port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        return tls.selected_alpn_protocol(), tls.version()


def test_http2_is_offered_through_alpn(door):
    assert negotiated(door, ["h2", "http/1.1"])[0] == "h2"
    assert negotiated(door, ["http/1.1"])[0] == "http/1.1"
    assert negotiated(door, ["h2", "http/1.1"])[1] in ("TLSv1.2", "TLSv1.3")


def test_plain_http_on_the_tls_port_is_refused(door):
    with pytest.raises(requests.ConnectionError):
        requests.post(
            f"http://127.0.0.1:{door.port}/v1/completions",
            json={"model": BASE, "prompt": "x", "max_tokens": 1},
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=10,
        )


def test_a_door_without_a_certificate_stays_plain_http():
    table = routing_table(deployment="gw", base_model=BASE, replicas=[], served=[])
    plain = render_config(table, Path("/tmp/gw"), listen="127.0.0.1:8200")
    assert "    bind 127.0.0.1:8200\n" in plain
    assert " ssl " not in plain.split("frontend openai", 1)[1].split("\n", 2)[1]
    tls = render_config(table, Path("/tmp/gw"), listen="0.0.0.0:8443", certificate="/tls/tls.pem")
    assert '    bind 0.0.0.0:8443 ssl crt "/tls/tls.pem" alpn h2,http/1.1\n' in tls
