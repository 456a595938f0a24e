"""Replicas from the Kubernetes API: the ready endpoints of the EndpointSlices
(discovery.k8s.io/v1) that match a deployment's label selector in its namespace.

`manage.py watch_replicas` runs one `EndpointSliceWatch` per such deployment.
Each lists the slices, then watches from the list's resourceVersion, resumes
every watch from the last version it saw, and lists again when the API server
answers 410 Gone (the version was compacted away). Every change is written to
the deployment's Replica rows; a replica that turns ready enqueues that
deployment's reconcile after commit, so a new or restarted pod gets the
promoted adapters within seconds instead of at the next beat.

Workers and beat never talk to the API: they read the Replica rows
(serving.replica_rows.replicas_sync), so only the watch process needs RBAC
(get, list, watch on endpointslices in the namespaces used).
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import close_old_connections, transaction

from serving.enqueue import reconcile_enqueue
from serving.models import Deployment, Replica

logger = logging.getLogger(__name__)

DISCOVERED_VIA = "k8s"
INITIAL_DELAY, MAX_DELAY = 0.5, 30.0
RBAC_HINT = (
    " (the service account needs get, list and watch on endpointslices.discovery.k8s.io"
    " in this namespace)"
)

# --- label selectors ------------------------------------------------------------
# Checked here so a bad selector is a 400 when the deployment is saved, not a
# watch that fails forever. Grammar: k8s.io/apimachinery/pkg/labels/selector.go.
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_PREFIX = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_KEY = rf"({_PREFIX}/)?{_NAME}"
_VALUE = rf"({_NAME})?"
_REQUIREMENT = re.compile(
    rf"^\s*(!\s*{_KEY}|{_KEY}\s*(==?|!=)\s*{_VALUE}|{_KEY}\s+(in|notin)\s*\(\s*{_VALUE}"
    rf"(\s*,\s*{_VALUE})*\s*\)|{_KEY})\s*$"
)
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def label_selector_problem(selector: str) -> str | None:
    """Why `selector` is not a Kubernetes label selector, or None."""
    if not selector.strip():
        return "the label selector is empty"
    for requirement in re.split(r",(?![^()]*\))", selector):
        if not _REQUIREMENT.match(requirement):
            return f"{requirement.strip()!r} is not a label selector requirement"
        prefix = requirement.strip().lstrip("!").split("/")[0]
        if "/" in requirement and len(prefix) > 253:
            return "a label key prefix is longer than 253 characters"
    return None


def namespace_problem(namespace: str) -> str | None:
    if not _NAMESPACE.match(namespace):
        return f"{namespace!r} is not a namespace name (lower-case DNS label, 63 characters)"
    return None


# Labels the endpoint-slice controller puts on the slices it keeps for a Service.
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
SLICE_CONTROLLER = "endpointslice-controller.k8s.io"


def service_selector(selector: str, service_name: str) -> str:
    """The deployment's selector narrowed to the controller's slices of one Service."""
    return f"{selector},{SERVICE_NAME_LABEL}={service_name},{MANAGED_BY_LABEL}={SLICE_CONTROLLER}"


def _of_the_service(slice_, selector: str) -> bool:
    # Checked again here, not trusted to the API server's filtering alone.
    labels = (slice_.metadata.labels or {}) if slice_.metadata else {}
    wanted = dict(
        part.split("=", 1)
        for part in selector.split(",")
        if part.startswith((SERVICE_NAME_LABEL + "=", MANAGED_BY_LABEL + "="))
    )
    return all(labels.get(key) == value for key, value in wanted.items())


# --- from slices to replica URLs ------------------------------------------------


def _port(slice_, deployment: Deployment) -> int:
    # A slice's ports are the pods' target ports: prefer the deployment's port
    # when the slice lists it, else the slice's only TCP port.
    ports = [p.port for p in slice_.ports or [] if p.port and (p.protocol or "TCP") == "TCP"]
    if deployment.replica_port in ports or not ports:
        return deployment.replica_port
    return ports[0]


def ready_urls(slices, deployment: Deployment) -> set[str]:
    """The base URL of every ready endpoint. `ready` unset means ready (the
    API's own rule); terminating pods are not ready."""
    urls = set()
    for slice_ in slices:
        if slice_.address_type not in ("IPv4", "IPv6"):
            continue
        port = _port(slice_, deployment)
        for endpoint in slice_.endpoints or []:
            conditions = endpoint.conditions
            if conditions is not None and conditions.ready is False:
                continue
            for address in endpoint.addresses or []:
                host = f"[{address}]" if slice_.address_type == "IPv6" else address
                urls.add(f"{deployment.replica_scheme}://{host}:{port}")
    return urls


def replicas_apply(deployment_id: int, urls: set[str]) -> list[str]:
    """Makes the deployment's active replicas exactly `urls`; returns the URLs
    that became ready. Rows are kept when a pod goes (their history matters)."""
    with transaction.atomic():
        existing = {
            r.base_url: r
            for r in Replica.objects.select_for_update(no_key=True).filter(
                deployment_id=deployment_id
            )
        }
        became_ready = []
        for url in sorted(urls):
            replica = existing.get(url)
            if replica is None:
                Replica.objects.create(
                    deployment_id=deployment_id, base_url=url, discovered_via=DISCOVERED_VIA
                )
                became_ready.append(url)
            elif not replica.active:
                # A restarted pod at an old address comes back without its adapters.
                Replica.objects.filter(pk=replica.pk).update(active=True, health="unknown")
                became_ready.append(url)
        Replica.objects.filter(deployment_id=deployment_id, active=True).exclude(
            base_url__in=urls
        ).update(active=False)
        if became_ready:
            # A reconcile loads what they should serve.
            reconcile_enqueue(deployment_id)
    return became_ready


# --- the client -----------------------------------------------------------------


def api_client():
    """An ApiClient from in-cluster credentials or a kubeconfig (KUBERNETES_AUTH)."""
    import os

    from kubernetes import client, config

    mode = settings.KUBERNETES_AUTH
    if mode == "auto":
        mode = "in-cluster" if os.environ.get("KUBERNETES_SERVICE_HOST") else "kubeconfig"
    if mode == "in-cluster":
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)
    else:
        configuration = client.Configuration()
        config.load_kube_config(
            config_file=settings.KUBERNETES_KUBECONFIG or None,
            context=settings.KUBERNETES_CONTEXT or None,
            client_configuration=configuration,
        )
    return client.ApiClient(configuration)


# --- the watch --------------------------------------------------------------------


@dataclass(frozen=True)
class WatchTarget:
    deployment_id: int
    namespace: str
    selector: str

    @classmethod
    def of(cls, deployment: Deployment) -> WatchTarget:
        return cls(
            deployment.pk,
            deployment.kubernetes_namespace,
            service_selector(
                deployment.kubernetes_label_selector, deployment.kubernetes_service_name
            ),
        )


@dataclass
class WatchStats:
    lists: int = 0
    watches: int = 0
    events: int = 0
    relists_after_gone: int = 0
    errors: int = 0
    last_error: str = ""
    last_progress: float = 0.0
    resource_version: str | None = None
    applied: list[set[str]] = field(default_factory=list)


class EndpointSliceWatch:
    """Keeps one deployment's Replica rows equal to its ready endpoints."""

    def __init__(self, target: WatchTarget, api_client, *, stop: threading.Event | None = None):
        from kubernetes import client

        self.target = target
        self.api = client.DiscoveryV1Api(api_client)
        self.stop_event = stop or threading.Event()
        self.stats = WatchStats(last_progress=time.time())
        self._slices: dict[str, object] = {}
        self._watch: Any = None  # a kubernetes.watch.Watch while one runs (imported lazily)
        self._applied: set[str] | None = None
        self._unapplied = False
        self._delay = INITIAL_DELAY

    # One list, then watches until stopped; every failure backs off and resumes.
    def run(self) -> None:
        from kubernetes.client.exceptions import ApiException

        while not self.stop_event.is_set():
            try:
                if self.stats.resource_version is None:
                    self.relist()
                elif self._unapplied:
                    # The last write failed (database down, locked): the slices
                    # in memory are current, so write them before resuming.
                    self._apply()
                self.watch_once()
            except ApiException as error:
                if error.status == 410:
                    # Compacted: the only way back is a fresh list.
                    self.stats.relists_after_gone += 1
                    self.stats.resource_version = None
                    continue
                hint = RBAC_HINT if error.status == 403 else ""
                self._failed(f"API {error.status}: {error.reason}{hint}")
            except Exception as error:  # dropped connections, timeouts, DNS: resume
                if self.stop_event.is_set():
                    break  # stop() cut the connection on purpose
                self._failed(f"{type(error).__name__}: {error}")
            finally:
                close_old_connections()

    def stop(self) -> None:
        self.stop_event.set()
        if self._watch is not None:
            self._watch.stop()

    def relist(self) -> None:
        timeout = settings.KUBERNETES_REQUEST_TIMEOUT_SECONDS
        listing = self.api.list_namespaced_endpoint_slice(
            self.target.namespace, label_selector=self.target.selector, _request_timeout=timeout
        )
        self.stats.lists += 1
        # The API server names every object and versions every list.
        self._slices = {
            item.metadata.name: item
            for item in listing.items or []
            if item.metadata and item.metadata.name
        }
        self.stats.resource_version = (
            listing.metadata.resource_version if listing.metadata else None
        )
        self._apply()
        self._mark_progress()

    def watch_once(self) -> None:
        """One watch request, from the last resourceVersion, until the server ends it."""
        from kubernetes import watch

        seconds = settings.KUBERNETES_WATCH_TIMEOUT_SECONDS
        self._watch = watch.Watch()
        self.stats.watches += 1
        # timeout_seconds also turns off the client's own 410 retry, which would
        # re-send the same expired version: this loop relists instead.
        stream = self._watch.stream(
            self.api.list_namespaced_endpoint_slice,
            self.target.namespace,
            label_selector=self.target.selector,
            resource_version=self.stats.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=seconds,
            _request_timeout=(settings.KUBERNETES_REQUEST_TIMEOUT_SECONDS, seconds + 30),
        )
        for event in stream:
            if self.stop_event.is_set():
                break
            self._on_event(event)
        self._mark_progress()

    def _on_event(self, event: dict) -> None:
        kind = event["type"]
        metadata = event["raw_object"].get("metadata", {})
        version = metadata.get("resourceVersion")
        self.stats.events += 1
        if kind in ("ADDED", "MODIFIED"):
            self._slices[event["object"].metadata.name] = event["object"]
        elif kind == "DELETED":
            self._slices.pop(metadata.get("name"), None)
        if version:
            self.stats.resource_version = version
        if kind != "BOOKMARK":
            self._apply()
        self._mark_progress()

    def _apply(self) -> None:
        self._unapplied = True
        # Never the vLLM key: this process holds no key to decrypt it (config/roles.py).
        deployment = (
            Deployment.objects.defer("vllm_api_key").filter(pk=self.target.deployment_id).first()
        )
        if deployment is None:
            self.stop_event.set()
            return
        slices = [s for s in self._slices.values() if _of_the_service(s, self.target.selector)]
        urls = ready_urls(slices, deployment)
        if urls == self._applied:
            self._unapplied = False
            return
        became_ready = replicas_apply(deployment.pk, urls)
        self._applied = urls
        self._unapplied = False
        self.stats.applied.append(urls)
        if became_ready:
            logger.info("%s: ready %s", deployment.name, ", ".join(became_ready))

    def _mark_progress(self) -> None:
        self.stats.last_progress = time.time()
        # Backoff grows over failures in a row only: one that follows progress starts small.
        self._delay = INITIAL_DELAY

    def _failed(self, message: str) -> None:
        self.stats.errors += 1
        self.stats.last_error = message
        logger.warning(
            "watch of %s/%s failed (%s); retrying in %.1fs",
            self.target.namespace,
            self.target.selector,
            message,
            self._delay,
        )
        self.stop_event.wait(self._delay * random.uniform(0.5, 1.0))
        self._delay = min(self._delay * 2, MAX_DELAY)


class WatchSupervisor:
    """One watch thread per deployment with Kubernetes discovery; follows the
    deployments table (added, removed, selector changed)."""

    def __init__(self, api_client):
        self.api_client = api_client
        self.watches: dict[WatchTarget, tuple[EndpointSliceWatch, threading.Thread]] = {}
        self.last_targets: set[WatchTarget] = set()

    def refresh(self) -> None:
        deployments = (
            Deployment.objects.defer("vllm_api_key")
            .exclude(kubernetes_namespace="")
            .exclude(kubernetes_label_selector="")
            .exclude(kubernetes_service_name="")
        )
        wanted = {WatchTarget.of(d) for d in deployments}
        self.last_targets = wanted
        for target in list(self.watches):
            if target not in wanted:
                watch, _thread = self.watches.pop(target)
                watch.stop()
        for target in wanted - set(self.watches):
            watch = EndpointSliceWatch(target, self.api_client)
            thread = threading.Thread(
                target=watch.run, name=f"watch-{target.deployment_id}", daemon=True
            )
            thread.start()
            self.watches[target] = (watch, thread)

    def stop(self, timeout: float = 5.0) -> None:
        for watch, _thread in self.watches.values():
            watch.stop()
        for _watch, thread in self.watches.values():
            thread.join(timeout)
        self.watches.clear()
