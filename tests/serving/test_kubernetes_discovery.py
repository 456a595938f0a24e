"""Kubernetes replica discovery, through the official client, against the
stand-in API server (tests/support/k8s_apiserver.py: no real one can run here).

Pods are stood in for by fake vLLM servers on loopback: each EndpointSlice
carries one of their ports, so a reconcile triggered by a new pod reaches it.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from django.core.management import call_command
from django.db import connections

from core.errors import ValidationFailed
from core.fields import encrypt
from serving.discovery.kubernetes import (
    EndpointSliceWatch,
    WatchSupervisor,
    WatchTarget,
    api_client,
    label_selector_problem,
    ready_urls,
)
from serving.models import Deployment, Replica
from serving.reconcile.tick import reconcile_deployment
from serving.rollouts.engine import rollout_execute
from serving.services.deployments import deployment_update
from serving.services.promotions import promotion_create
from tests.conftest import actor
from tests.serving.conftest import make_deployment
from tests.support.k8s_apiserver import StandInKubeAPIServer

NAMESPACE = "ml"
SELECTOR = "serving.kserve.io/inferenceservice=granite-8b"
SERVICE = "granite-8b-predictor"
LABELS = {
    "serving.kserve.io/inferenceservice": "granite-8b",
    "kubernetes.io/service-name": SERVICE,
    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
}
# What the watch asks the API server for: the deployment's selector, narrowed to
# the endpoint-slice controller's slices of the named Service.
WATCHED = (
    f"{SELECTOR},kubernetes.io/service-name={SERVICE},"
    "endpointslice.kubernetes.io/managed-by=endpointslice-controller.k8s.io"
)


@pytest.fixture
def apiserver():
    with StandInKubeAPIServer(bookmark_seconds=0.2) as server:
        yield server


@pytest.fixture
def kubeconfig(settings, apiserver, tmp_path):
    settings.KUBERNETES_AUTH = "kubeconfig"
    settings.KUBERNETES_KUBECONFIG = str(apiserver.write_kubeconfig(tmp_path / "kubeconfig"))
    settings.KUBERNETES_WATCH_TIMEOUT_SECONDS = 1
    settings.KUBERNETES_REQUEST_TIMEOUT_SECONDS = 5
    return settings.KUBERNETES_KUBECONFIG


@pytest.fixture
def k8s_deployment(root, tmp_path):
    return make_deployment(
        root,
        [],
        tmp_path / "volume",
        name="granite-8b",
        kubernetes_namespace=NAMESPACE,
        kubernetes_label_selector=SELECTOR,
        kubernetes_service_name=SERVICE,
    )


@pytest.fixture
def enqueued(monkeypatch):
    """Reconciles enqueued on commit, by deployment id."""
    from serving import tasks

    calls: list[int] = []
    monkeypatch.setattr(
        tasks.reconcile_one, "delay", lambda deployment_id: calls.append(deployment_id)
    )
    return calls


@pytest.fixture
def watch(kubeconfig, k8s_deployment):
    return EndpointSliceWatch(WatchTarget.of(k8s_deployment), api_client())


def pod(server, name, fake, ready=True, labels=LABELS):
    port = int(fake.base_url.rsplit(":", 1)[1])
    server.apply_slice(NAMESPACE, name, labels=labels, endpoints=[("127.0.0.1", ready)], port=port)


def active(deployment) -> set[str]:
    return set(
        Replica.objects.filter(deployment=deployment, active=True).values_list(
            "base_url", flat=True
        )
    )


pytestmark = pytest.mark.django_db


def test_selectors_are_checked_when_the_deployment_is_saved(root, k8s_deployment):
    assert label_selector_problem("app=vllm,tier in (a, b),!canary") is None
    assert label_selector_problem("serving.kserve.io/inferenceservice!=x") is None
    assert label_selector_problem("app==") is None  # an empty value: selects app=""
    for bad in ("", "=x", "a b", "tier in a", "app=(x)", "-app=x"):
        assert label_selector_problem(bad), bad
    with pytest.raises(ValidationFailed, match="not a label selector requirement"):
        deployment_update(
            actor=actor(root), deployment=k8s_deployment, kubernetes_label_selector="a b"
        )
    with pytest.raises(ValidationFailed, match="not a namespace name"):
        deployment_update(actor=actor(root), deployment=k8s_deployment, kubernetes_namespace="ML_")
    with pytest.raises(ValidationFailed, match="one way to find replicas"):
        deployment_update(
            actor=actor(root), deployment=k8s_deployment, replica_dns_name="vllm.ml.svc"
        )


def test_ready_urls_follow_the_api_rules_for_readiness_ports_and_address_types(k8s_deployment):
    from kubernetes.client import (
        DiscoveryV1EndpointPort,
        V1Endpoint,
        V1EndpointConditions,
        V1EndpointSlice,
        V1ObjectMeta,
    )

    def endpoint(address, ready):
        return V1Endpoint(addresses=[address], conditions=V1EndpointConditions(ready=ready))

    def slice_(kind, endpoints, ports):
        return V1EndpointSlice(
            address_type=kind,
            endpoints=endpoints,
            metadata=V1ObjectMeta(name=f"s-{kind}"),
            ports=[DiscoveryV1EndpointPort(port=p, protocol="TCP") for p in ports],
        )

    slices = [
        # ready unset means ready; the deployment's port wins when the slice lists it
        slice_("IPv4", [endpoint("10.0.0.1", None), endpoint("10.0.0.2", False)], [9090, 8000]),
        slice_("IPv6", [endpoint("fd00::1", True)], [8080]),  # else the slice's only port
        slice_("FQDN", [endpoint("vllm.example.com", True)], [8000]),  # not a pod address
    ]
    assert ready_urls(slices, k8s_deployment) == {
        "http://10.0.0.1:8000",
        "http://[fd00::1]:8080",
    }


def test_the_api_takes_kubernetes_discovery(as_root, tmp_path):
    body = {
        "name": "granite-8b",
        "base_model_name": "granite",
        "kubernetes_namespace": NAMESPACE,
        "kubernetes_label_selector": SELECTOR,
        "kubernetes_service_name": SERVICE,
        "volume_write_path": str(tmp_path),
        "volume_serve_path": "/mnt/adapters",
    }
    response = as_root.post("/api/v1/deployments/", body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["kubernetes_label_selector"] == SELECTOR
    bad = as_root.post(
        "/api/v1/deployments/",
        {**body, "name": "other", "kubernetes_label_selector": "in (x)"},
        format="json",
    )
    assert bad.status_code == 400
    assert "label selector" in bad.json()["error"]["message"]


def test_it_follows_pods_appearing_turning_unready_and_vanishing(
    watch, apiserver, k8s_deployment, fake_replicas, enqueued, django_capture_on_commit_callbacks
):
    a, b = fake_replicas
    pod(apiserver, "granite-8b-a", a)
    pod(apiserver, "unrelated", b, labels={"app": "other"})
    with django_capture_on_commit_callbacks(execute=True):
        watch.relist()
    assert active(k8s_deployment) == {a.base_url}
    assert enqueued == [k8s_deployment.pk]

    pod(apiserver, "granite-8b-b", b, ready=False)  # scheduled, not ready yet
    with django_capture_on_commit_callbacks(execute=True):
        watch.watch_once()
    assert active(k8s_deployment) == {a.base_url}
    assert enqueued == [k8s_deployment.pk]

    pod(apiserver, "granite-8b-b", b, ready=True)
    with django_capture_on_commit_callbacks(execute=True):
        watch.watch_once()
    assert active(k8s_deployment) == {a.base_url, b.base_url}
    assert enqueued == [k8s_deployment.pk, k8s_deployment.pk]

    pod(apiserver, "granite-8b-a", a, ready=False)
    with django_capture_on_commit_callbacks(execute=True):
        watch.watch_once()
    assert active(k8s_deployment) == {b.base_url}

    apiserver.delete_slice(NAMESPACE, "granite-8b-b")
    with django_capture_on_commit_callbacks(execute=True):
        watch.watch_once()
    assert active(k8s_deployment) == set()
    # Rows stay for their history, inactive; nothing more was enqueued.
    assert Replica.objects.filter(deployment=k8s_deployment).count() == 2
    assert enqueued == [k8s_deployment.pk, k8s_deployment.pk]
    # Every watch resumed from the version the previous one ended on.
    versions = [r["resourceVersion"] for r in apiserver.watch_requests()]
    assert all(versions) and versions == sorted(versions, key=int)
    assert sum(1 for r in apiserver.requests if not r["watch"]) == 1
    assert {r["labelSelector"] for r in apiserver.requests} == {WATCHED}


def test_the_api_key_reaches_only_the_named_services_endpoints(
    watch, apiserver, k8s_deployment, fake_replicas, enqueued
):
    """Issue 21: any ready slice whose labels matched got the vLLM API key. A
    hand-made slice, or another Service's, with the same labels is not a replica."""
    a, b = fake_replicas
    pod(apiserver, "granite-8b-a", a)
    pod(apiserver, "look-alike", b, labels={**LABELS, "kubernetes.io/service-name": "attacker"})
    hand_made = {k: v for k, v in LABELS.items() if "managed-by" not in k}
    pod(apiserver, "hand-made", b, labels=hand_made)
    pod(
        apiserver,
        "other-manager",
        b,
        labels={**LABELS, "endpointslice.kubernetes.io/managed-by": "someone-else"},
    )
    watch.relist()
    assert active(k8s_deployment) == {a.base_url}


def test_kubernetes_discovery_needs_the_service_name(root, k8s_deployment):
    with pytest.raises(ValidationFailed, match="kubernetes_service_name"):
        deployment_update(actor=actor(root), deployment=k8s_deployment, kubernetes_service_name="")


def test_a_slice_relabelled_out_of_the_selector_is_a_pod_gone(
    watch, apiserver, k8s_deployment, fake_replicas, enqueued
):
    a, _ = fake_replicas
    pod(apiserver, "granite-8b-a", a)
    watch.relist()
    pod(apiserver, "granite-8b-a", a, labels={"app": "other"})
    watch.watch_once()
    assert active(k8s_deployment) == set()


def test_a_dropped_watch_resumes_from_its_resource_version(
    watch, apiserver, k8s_deployment, fake_replicas, enqueued, settings
):
    a, b = fake_replicas
    pod(apiserver, "granite-8b-a", a)
    watch.relist()
    settings.KUBERNETES_WATCH_TIMEOUT_SECONDS = 30
    cut_done = threading.Event()

    def cut_once_watching():
        # Cuts again every 0.2 s once the watch was asked for: one cut at a fixed
        # 0.5 s could come before the watch was open when the light run (niced
        # beside vLLM) waited for the CPU, and the watch then ran its 30 s.
        asked = len(apiserver.watch_requests())
        while not cut_done.wait(0.2):
            if len(apiserver.watch_requests()) > asked:
                apiserver.drop_watches()

    cut = threading.Thread(target=cut_once_watching)
    cut.start()
    started = time.monotonic()
    try:
        with pytest.raises(Exception) as broken:  # urllib3's ProtocolError, as from a real cut
            watch.watch_once()
    finally:
        cut_done.set()
        cut.join()
    assert time.monotonic() - started < 10, "the cut did not end the watch"
    assert "ProtocolError" in type(broken.value).__name__ or "Incomplete" in str(broken.value)
    seen = watch.stats.resource_version

    pod(apiserver, "granite-8b-b", b)  # happens while nobody watches
    settings.KUBERNETES_WATCH_TIMEOUT_SECONDS = 1
    watch.watch_once()
    assert active(k8s_deployment) == {a.base_url, b.base_url}
    assert apiserver.watch_requests()[-1]["resourceVersion"] == seen
    assert sum(1 for r in apiserver.requests if not r["watch"]) == 1, "resumed, not relisted"


@pytest.mark.django_db(transaction=True)
def test_410_gone_lists_again(watch, apiserver, k8s_deployment, fake_replicas, enqueued):
    a, b = fake_replicas
    pod(apiserver, "granite-8b-a", a)
    watch.relist()
    pod(apiserver, "granite-8b-b", b)
    apiserver.delete_slice(NAMESPACE, "granite-8b-a")
    apiserver.compact()  # the changes since our version are gone from the history

    runner = threading.Thread(target=watch.run, daemon=True)
    runner.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and active(k8s_deployment) != {b.base_url}:
            time.sleep(0.05)
    finally:
        watch.stop()
        runner.join(5)
    assert active(k8s_deployment) == {b.base_url}, watch.stats.last_error
    assert watch.stats.relists_after_gone >= 1
    lists = [r for r in apiserver.requests if not r["watch"]]
    assert len(lists) >= 2


def test_a_new_ready_pod_gets_the_promoted_adapters_from_the_reconcile_it_triggers(
    watch,
    apiserver,
    k8s_deployment,
    fake_replicas,
    enqueued,
    lena,
    approved_v1,
    django_capture_on_commit_callbacks,
):
    a, b = fake_replicas
    pod(apiserver, "granite-8b-a", a)
    watch.relist()
    promotion = promotion_create(actor=actor(lena), deployment=k8s_deployment, version=approved_v1)
    rollout = promotion.rollouts.get()
    assert rollout_execute(rollout.pk, "w") == "succeeded"
    rollout.refresh_from_db()
    assert a.adapters == {"legal-contracts": rollout.served_path}
    assert b.adapters == {}

    enqueued.clear()
    pod(apiserver, "granite-8b-b", b)
    with django_capture_on_commit_callbacks(execute=True):
        watch.watch_once()
    assert enqueued == [k8s_deployment.pk]
    # What the worker would do with the enqueued task.
    reconcile_deployment(enqueued[0], "worker")
    assert b.adapters == {"legal-contracts": rollout.served_path}


@pytest.mark.django_db(transaction=True)
def test_the_watch_command_runs_the_loop(
    kubeconfig, apiserver, k8s_deployment, fake_replicas, enqueued, settings, tmp_path
):
    a, _ = fake_replicas
    pod(apiserver, "granite-8b-a", a)
    settings.KUBERNETES_DEPLOYMENTS_REFRESH_SECONDS = 0.2
    heartbeat = tmp_path / "heartbeat"

    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    returned = threading.Event()

    def stop_once_followed():
        # Stopped as Kubernetes stops it (SIGTERM) once the loop did its work, not
        # after a fixed 1.5 s, which the light run (niced beside vLLM) may spend
        # waiting for the CPU; --seconds only bounds a loop that never gets there.
        deadline = time.monotonic() + 60
        try:
            while not returned.is_set() and time.monotonic() < deadline:
                if heartbeat.exists() and active(k8s_deployment) and enqueued:
                    break
                time.sleep(0.05)
        finally:
            connections.close_all()
        # Only to the command's own handler (never to pytest's).
        if (
            not returned.is_set()
            and signal.getsignal(signal.SIGTERM) is not handlers[signal.SIGTERM]
        ):
            os.kill(os.getpid(), signal.SIGTERM)

    stopper = threading.Thread(target=stop_once_followed)
    stopper.start()
    try:
        call_command("watch_replicas", seconds=90, heartbeat_file=str(heartbeat))
    finally:
        returned.set()
        stopper.join()
        left = {s: signal.getsignal(s) for s in handlers}
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    # The command put the caller's handlers back (pytest's, here).
    assert left == handlers
    assert active(k8s_deployment) == {a.base_url}
    assert enqueued == [k8s_deployment.pk]
    assert heartbeat.exists()


def test_bad_credentials_are_an_api_error_not_a_crash(
    watch, apiserver, k8s_deployment, fake_replicas
):
    from kubernetes.client.exceptions import ApiException

    apiserver.token = "rotated"
    with pytest.raises(ApiException) as error:
        watch.relist()
    assert error.value.status == 401


@pytest.mark.django_db(transaction=True)
def test_the_supervisor_follows_the_deployments_table(
    kubeconfig, apiserver, root, k8s_deployment, fake_replicas, enqueued, tmp_path
):
    supervisor = WatchSupervisor(api_client())
    try:
        supervisor.refresh()
        first = WatchTarget.of(k8s_deployment)
        assert set(supervisor.watches) == {first}
        _, old_thread = supervisor.watches[first]

        other = make_deployment(
            root,
            [],
            tmp_path / "other",
            name="other",
            kubernetes_namespace=NAMESPACE,
            kubernetes_label_selector="app=other",
            kubernetes_service_name="other",
        )
        changed = deployment_update(
            actor=actor(root), deployment=k8s_deployment, kubernetes_label_selector="app=changed"
        )
        static = make_deployment(root, [fake_replicas[1].base_url], tmp_path / "s", name="static")
        supervisor.refresh()
        assert set(supervisor.watches) == {WatchTarget.of(changed), WatchTarget.of(other)}
        old_thread.join(30)  # at once, but the light run is niced beside vLLM
        assert not old_thread.is_alive(), "the watch of the old selector was not stopped"

        other_labels = {**LABELS, "app": "other", "kubernetes.io/service-name": "other"}
        pod(apiserver, "other-a", fake_replicas[0], labels=other_labels)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not active(other):
            time.sleep(0.05)
        assert active(other) == {fake_replicas[0].base_url}
        assert active(changed) == set()
        assert not Replica.objects.filter(deployment=static).exists()
    finally:
        supervisor.stop()
    assert supervisor.watches == {}


def test_the_command_without_credentials_says_so(settings, tmp_path):
    from django.core.management import CommandError

    settings.KUBERNETES_AUTH = "kubeconfig"
    settings.KUBERNETES_KUBECONFIG = str(tmp_path / "missing")
    with pytest.raises(CommandError, match="No Kubernetes credentials"):
        call_command("watch_replicas", seconds=0.1)


@pytest.mark.django_db(transaction=True)
def test_a_failed_write_is_retried_before_the_watch_resumes(
    watch, apiserver, k8s_deployment, fake_replicas, enqueued, monkeypatch
):
    from django.db import OperationalError

    from serving.discovery import kubernetes

    a, b = fake_replicas
    real = kubernetes.replicas_apply
    failures = []

    def flaky(deployment_id, urls):
        if len(urls) == 2 and not failures:
            failures.append(urls)
            raise OperationalError("database is locked")
        return real(deployment_id, urls)

    monkeypatch.setattr(kubernetes, "replicas_apply", flaky)
    pod(apiserver, "granite-8b-a", a)
    runner = threading.Thread(target=watch.run, daemon=True)
    runner.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and active(k8s_deployment) != {a.base_url}:
            time.sleep(0.05)
        pod(apiserver, "granite-8b-b", b)  # its write fails once; no event comes after it
        while time.monotonic() < deadline and len(active(k8s_deployment)) != 2:
            time.sleep(0.05)
    finally:
        watch.stop()
        runner.join(5)
    assert failures, "the write never failed: the test tested nothing"
    assert active(k8s_deployment) == {a.base_url, b.base_url}
    assert watch.stats.errors == 1, watch.stats.last_error
    assert "database is locked" in watch.stats.last_error


@pytest.mark.django_db(transaction=True)
def test_the_watch_runs_without_the_key_that_decrypts_the_vllm_key(
    kubeconfig, apiserver, k8s_deployment, fake_replicas, enqueued, settings
):
    """The discovery process is given neither DJANGO_SECRET_KEY nor
    FIELD_ENCRYPTION_KEY (config/roles.py): it never loads the deployment's
    vLLM key, which only those could decrypt."""
    Deployment.objects.filter(pk=k8s_deployment.pk).update(vllm_api_key=encrypt("replica-key"))
    settings.SECRET_KEY = ""
    settings.FIELD_ENCRYPTION_KEY = ""
    a, _ = fake_replicas
    pod(apiserver, "granite-8b-a", a)
    supervisor = WatchSupervisor(api_client())
    try:
        supervisor.refresh()
        assert set(supervisor.watches) == {WatchTarget.of(k8s_deployment)}
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not active(k8s_deployment):
            time.sleep(0.05)
        assert active(k8s_deployment) == {a.base_url}
    finally:
        supervisor.stop()
