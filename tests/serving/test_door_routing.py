"""The desired routing table (serving/door/routing.py), a pure function,
and the HAProxy configuration rendered from it (checked by a real `haproxy -c`).
Real HAProxy in front of real vLLM: tests/serving/vllm/test_door_routes_real.py."""

from __future__ import annotations

import re
import subprocess

import pytest

from serving.door.haproxy.config import Peer, render_config
from serving.door.haproxy.maps import ACCESS_MAPS, HELD_MAP, render_map
from serving.door.routing import ReplicaView, ServedView, ServerState, routing_table
from serving.door.selectors import routing_table_for
from tests.support.haproxy import needs_haproxy

READY, MAINT = ServerState.READY, ServerState.MAINT


def table(replicas, served):
    return routing_table(deployment="d", base_model="tiny", replicas=replicas, served=served)


def test_an_adapter_is_routed_only_where_its_current_version_was_seen_loaded():
    replicas = [
        ReplicaView(1, "http://10.0.0.1:8000", down=False, loaded={"a": "/v/a-2"}),
        ReplicaView(2, "http://10.0.0.2:8000", down=False, loaded={"a": "/v/a-1"}),  # stale
        ReplicaView(3, "http://10.0.0.3:8000", down=True, loaded={"a": "/v/a-2"}),  # down
        ReplicaView(4, "http://10.0.0.4:8000", down=False, loaded={}),
    ]
    routes = table(replicas, [ServedView("a", "/v/a-2", held=False)]).routes
    assert routes["a"].states == {"r1": READY, "r2": MAINT, "r3": MAINT, "r4": MAINT}
    # The base model goes to every replica that is not down.
    assert routes["tiny"].base and routes["tiny"].ready_servers() == ["r1", "r2", "r4"]
    assert set(routes) == {"tiny", "a"}  # anything else: 404


def test_a_held_adapter_is_marked_and_an_adapter_never_shadows_the_base_model():
    replicas = [ReplicaView(1, "https://vllm.example:8443", down=False, loaded={})]
    built = table(replicas, [ServedView("a", "/p", held=True), ServedView("tiny", "/x", False)])
    assert built.routes["a"].held
    assert built.routes["tiny"].base
    (endpoint,) = built.endpoints
    assert (endpoint.server, endpoint.host, endpoint.port, endpoint.tls) == (
        "r1",
        "vllm.example",
        8443,
        True,
    )


@needs_haproxy
def test_the_rendered_configuration_is_valid_for_haproxy(tmp_path):
    replicas = [
        ReplicaView(1, "http://127.0.0.1:9001", down=False, loaded={"a": "/p"}),
        ReplicaView(2, "http://127.0.0.1:9002", down=False, loaded={}),
    ]
    built = table(replicas, [ServedView("a", "/p", held=False)])
    (tmp_path / "models.map").write_text(render_map(built))
    for name in ACCESS_MAPS:
        (tmp_path / f"{name}.map").touch()
    (tmp_path / HELD_MAP).touch()  # door.lua loads it at start
    (tmp_path / "unavailable.http").write_text("HTTP/1.1 503 x\r\n\r\n")
    config = render_config(
        built, tmp_path, listen="127.0.0.1:1", states={("m_a", "r2"): ServerState.DRAIN}
    )
    (tmp_path / "haproxy.cfg").write_text(config)
    checked = subprocess.run(
        ["haproxy", "-c", "-f", str(tmp_path / "haproxy.cfg")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "server r2 127.0.0.1:9002 weight 0" in config  # a held drain survives a reload
    assert "server r1 127.0.0.1:9001\n" in config
    assert render_map(built) == "a m_a\ntiny base\n"
    # Whatever X-Request-Id the client sent, vLLM gets the door's (metering).
    assert (
        'http-request set-header x-request-id "u1.k%[var(txn.key_id)].v%[var(txn.version)].%[uuid]"'
        in config
    )


@pytest.mark.django_db
def test_the_selector_reads_what_the_rollouts_and_reconcile_recorded(
    deployment, contracts, approved_v1
):
    from datetime import timedelta

    from django.utils import timezone

    from serving.models import Replica, ServedAdapter

    Replica.objects.filter(deployment=deployment).delete()
    up = Replica.objects.create(
        deployment=deployment,
        base_url="http://10.0.0.1:8000",
        health="up",
        loaded_adapters=[{"id": contracts.served_name, "root": "/srv/contracts-1"}],
    )
    Replica.objects.create(
        deployment=deployment, base_url="http://10.0.0.2:8000", health="down", loaded_adapters=[]
    )
    Replica.objects.create(deployment=deployment, base_url="http://10.0.0.3:8000", active=False)
    ServedAdapter.objects.create(
        deployment=deployment,
        adapter=contracts,
        version=approved_v1,
        served_path="/srv/contracts-1",
        lease_until=timezone.now() + timedelta(seconds=30),
    )
    built = routing_table_for(deployment)
    route = built.routes[contracts.served_name]
    assert route.held
    assert route.ready_servers() == [f"r{up.pk}"]
    assert len(built.endpoints) == 2  # the inactive replica is not a server


@needs_haproxy
def test_a_drain_never_leaves_a_model_without_a_replica_unless_told_to(tmp_path):
    """Real HAProxy (its runtime API); the replicas' addresses are never called."""
    from serving.door.haproxy import HAProxyFrontDoor
    from tests.support.haproxy import running_haproxy
    from tests.support.vllm_servers import free_port

    door = HAProxyFrontDoor(tmp_path / "gw", listen=f"127.0.0.1:{free_port()}")
    replicas = [
        ReplicaView(1, "http://127.0.0.1:9", down=False, loaded={"a": "/p", "b": "/p"}),
        ReplicaView(2, "http://127.0.0.1:9", down=False, loaded={"b": "/p"}),
    ]
    door.write(table(replicas, [ServedView("a", "/p", False), ServedView("b", "/p", False)]))
    with running_haproxy(door, log=tmp_path / "haproxy.log"):
        # "a" is on r1 only: make before break keeps it there (an in-place swap).
        assert door.drain("a", "r1", timeout=1) == ["kept m_a/r1 ready: no other replica serves a"]
        assert door.runtime.servers()[("m_a", "r1")].state == READY
        # "b" is on both: r1 drains, and then r2 is the one kept.
        assert door.drain("b", "r1", timeout=1) == ["set server m_b/r1 state drain"]
        assert door.runtime.servers()[("m_b", "r1")].state == ServerState.DRAIN
        assert door.drain("b", "r2", timeout=1)[0].startswith("kept m_b/r2")
        # A retire drains the last one too.
        assert door.drain("a", "r1", timeout=1, keep_one=False) == ["set server m_a/r1 state drain"]
        assert door.ready("b", "r1") == ["set server m_b/r1 state ready"]
        assert door.runtime.servers()[("m_b", "r1")].state == READY


@pytest.mark.django_db
def test_the_command_bootstraps_a_front_door_then_syncs_the_deployment(
    settings, tmp_path, deployment, django_assert_num_queries
):
    from io import StringIO

    from django.core.management import CommandError, call_command

    settings.SERVING_DOOR_DIR = tmp_path
    settings.SERVING_DOORS = {
        "not-yet": "127.0.0.1:1",
        "fresh": "127.0.0.1:3",
        deployment.name: "127.0.0.1:2",
    }
    out = StringIO()
    call_command("door_sync", "not-yet", "--base-model", "tiny", stdout=out)
    assert (tmp_path / "not-yet" / "models.map").read_text() == "tiny base\n"
    # The gateway's own container has no database: --offline and --print-command
    # ask it nothing, and a configuration the workers wrote is kept.
    with django_assert_num_queries(0):
        call_command("door_sync", "fresh", "--offline", "--base-model", "tiny", stdout=out)
        call_command("door_sync", "not-yet", "--offline", "--base-model", "other", stdout=out)
        call_command("door_sync", "not-yet", "--print-command", stdout=out)
    assert (tmp_path / "fresh" / "models.map").read_text() == "tiny base\n"
    assert (tmp_path / "not-yet" / "models.map").read_text() == "tiny base\n"
    assert "front door of not-yet: configuration kept" in out.getvalue()
    assert f"-f {tmp_path}/not-yet/haproxy.cfg" in out.getvalue()
    # A registered deployment: its replicas are discovered and routed (HAProxy not running).
    call_command("door_sync", deployment.name, stdout=out)
    config = (tmp_path / deployment.name / "haproxy.cfg").read_text()
    base = config.split("backend base\n", 1)[1].split("\n\n", 1)[0]
    assert base.count("    server r") == len(deployment.replica_urls)
    with pytest.raises(CommandError, match="SERVING_DOORS"):
        call_command("door_sync", "elsewhere", "--base-model", "tiny")
    # Its old name, which manifests written before the rename call, still works.
    err = StringIO()
    call_command("gateway_sync", "not-yet", "--print-command", stdout=out, stderr=err)
    assert "gateway_sync is renamed door_sync" in err.getvalue()


@needs_haproxy
def test_every_option_at_once_renders_a_configuration_haproxy_takes_with_no_template_left(
    tmp_path,
):
    # haproxy.cfg is a template whose tag-only lines leave nothing behind: a
    # stray tag or an empty line inside a section would be HAProxy's to read.
    replicas = [
        ReplicaView(1, "http://127.0.0.1:9001", down=False, loaded={"a": "/p"}),
        ReplicaView(2, "http://127.0.0.1:9002", down=False, loaded={"a": "/p"}),
    ]
    built = table(replicas, [ServedView("a", "/p", held=False, weights={"r1": 10, "r2": 90})])
    (tmp_path / "models.map").write_text(render_map(built))
    for name in (*ACCESS_MAPS, "lease"):
        (tmp_path / f"{name}.map").touch()
    (tmp_path / HELD_MAP).touch()
    (tmp_path / "unavailable.http").write_text("HTTP/1.1 503 x\r\n\r\n")
    peers = (Peer("door-a", "127.0.0.1:1"), Peer("door-b", "127.0.0.1:2"))
    config = render_config(
        built, tmp_path, listen="127.0.0.1:1", metrics="127.0.0.1:2", lease=True,
        peers=peers, peer_name="door-a", source_connections=8,
    )  # fmt: skip
    (tmp_path / "haproxy.cfg").write_text(config)
    checked = subprocess.run(
        ["haproxy", "-c", "-L", "door-a", "-f", str(tmp_path / "haproxy.cfg")],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert not re.search(r"\{%.*?%\}|\{\{.*?\}\}|\{#.*?#\}", config)
    sections = config.split("\n\n")
    assert all(section.strip() for section in sections), "an empty line too many"
    assert all(line == line.rstrip() for line in config.splitlines())
    for expected in (
        "peers door_peers\n    peer door-a 127.0.0.1:1\n    peer door-b 127.0.0.1:2\n",
        "table_gpc0(door_rates_door-b)",
        "tcp-request connection reject if { sc0_conn_cur gt 8 } || { sc0_conn_rate gt 80 }",
        "backend m_a\n    balance roundrobin\n",
        "    server r1 127.0.0.1:9001 weight 10\n",
        "frontend metrics\n    bind 127.0.0.1:2\n",
        "backend door_503_lease\n",
    ):
        assert expected in config, expected


def test_the_front_door_modules_import_without_django_settings():
    # bench/swap_through_gateway.py renders HAProxy's configuration before any
    # settings exist: an import of serving.models here broke it.
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    code = "import serving.door.haproxy, serving.door.routing"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.django_db
@needs_haproxy
def test_an_access_sync_with_nothing_changed_is_six_queries_and_two_runtime_reads(
    settings, tmp_path, deployment, django_assert_num_queries, monkeypatch
):
    """The reconcile syncs every door's access table each tick: in step, that
    is door_access's queries and a read of the door's fingerprint, no push."""
    from serving.door.haproxy.runtime import RuntimeAPI
    from serving.door.services import door_sync_access, front_door_for
    from tests.support.haproxy import running_haproxy
    from tests.support.vllm_servers import free_port

    settings.SERVING_DOORS = {deployment.name: f"127.0.0.1:{free_port()}"}
    settings.SERVING_DOOR_DIR = tmp_path
    door = front_door_for(deployment)
    door.write(routing_table_for(deployment))
    with running_haproxy(door, log=tmp_path / "haproxy.log"):
        assert door_sync_access(deployment)  # the first push
        sent = []
        command = RuntimeAPI.command
        monkeypatch.setattr(
            RuntimeAPI, "command", lambda api, line: sent.append(line) or command(api, line)
        )
        with django_assert_num_queries(6):
            assert door_sync_access(deployment) == []
    # Is it running, and the fingerprint it holds: two reads, nothing written.
    assert sent == ["show info", f"show map {door.directory.resolve()}/door.map"]
