"""Fingerprints against the vLLM stand-in (tests/support/vllm_standin.py): its
logprobs depend on the adapter's weights as read at load, so a replica that
loaded other bytes from the right path answers differently, as real vLLM does
(tests/serving/vllm/test_fingerprint_real.py shows it there)."""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests
from django.db import connections
from django.utils import timezone

from serving.models import DriftEvent, Replica, ReplicaRollout, VersionFingerprint
from serving.reconcile.tick import reconcile_deployment
from serving.records.fingerprints import fingerprint_compare, next_in_rotation
from serving.replica_rows import replicas_sync
from serving.rollouts.engine import rollout_execute
from serving.rules.probe import PROBE_PROMPT, PROBE_TOKENS, Probe
from serving.services.promotions import promotion_create
from serving.volume import stage_version
from tests.conftest import actor, client_for
from tests.factories import make_adapter, make_approved_version
from tests.support.adapters import AdapterSpec, write_adapter_dir
from tests.support.vllm_standin import running_fleet

from .conftest import make_deployment

pytestmark = pytest.mark.django_db

NAME = "legal-contracts"


@pytest.fixture
def fleet():
    with running_fleet(2) as fleet:
        yield fleet


@pytest.fixture
def urls(fleet):
    """The replicas' URLs as rollouts order them: the first records the fingerprint."""
    return sorted(fleet.urls)


@pytest.fixture
def deployment(root, urls, tmp_path):
    return make_deployment(root, urls, tmp_path / "volume", name="standin")


def standin(fleet, url):
    return fleet.replicas[fleet.urls.index(url)]


def probe(url: str, model: str = NAME) -> Probe:
    answer = requests.post(
        url + "/v1/completions",
        json={
            "model": model,
            "prompt": PROBE_PROMPT,
            "max_tokens": PROBE_TOKENS,
            "temperature": 0,
            "logprobs": 1,
        },
        timeout=10,
    )
    answer.raise_for_status()
    return Probe.from_body(answer.json())


def post(url: str, route: str, **body) -> None:
    requests.post(url + route, json=body, timeout=10).raise_for_status()


def promote(user, deployment, version) -> str:
    promotion = promotion_create(actor=actor(user), deployment=deployment, version=version)
    rollout = promotion.rollouts.get()
    rollout_execute(rollout.pk, "w")
    rollout.refresh_from_db()
    return rollout


@contextmanager
def other_bytes_at(path: str, spec: AdapterSpec):
    """For the duration, the folder at `path` holds other weights (a replica
    reading a stale or wrong volume); the right folder is put back after."""
    folder = Path(path)
    aside = folder.with_name(folder.name + ".aside")
    os.rename(folder, aside)
    write_adapter_dir(folder, spec)
    try:
        yield
    finally:
        for item in folder.iterdir():
            item.unlink()
        folder.rmdir()
        os.rename(aside, folder)


def load_stale(url: str, path: str, name: str = NAME) -> None:
    """The replica loads `name` from the right path while other bytes are there."""
    with other_bytes_at(path, AdapterSpec(seed=99)):
        requests.post(url + "/v1/unload_lora_adapter", json={"lora_name": name}, timeout=10)
        post(url, "/v1/load_lora_adapter", lora_name=name, lora_path=path)


def test_the_first_verified_replica_records_the_fingerprint_once(
    lena, deployment, approved_v1, urls
):
    rollout = promote(lena, deployment, approved_v1)
    assert rollout.status == "succeeded"

    fingerprint = VersionFingerprint.objects.get()
    assert (fingerprint.deployment, fingerprint.version) == (deployment, approved_v1)
    assert fingerprint.recorded_from.base_url == urls[0]
    assert fingerprint.recorded_from_url == urls[0]
    assert fingerprint.rollout == rollout
    assert Probe.from_dict(fingerprint.probe) == probe(urls[0]) == probe(urls[1])

    assert rollout_execute(rollout.pk, "w2") == "succeeded"
    assert VersionFingerprint.objects.get().created_at == fingerprint.created_at


def test_a_replica_with_other_weights_under_the_same_name_fails_verification(
    lena, deployment, approved_v1, urls
):
    # The second replica already serves the name from the version's path, but
    # read other bytes there: the listing looks right, the weights are not.
    path = stage_version(deployment, approved_v1).serve_path
    load_stale(urls[1], path)

    rollout = promote(lena, deployment, approved_v1)

    assert rollout.status == "rolled_back"
    assert "Verification failed on 1 replica(s)" in rollout.error
    assert f"{urls[1]}: {NAME} serves other weights" in rollout.error
    step = ReplicaRollout.objects.get(rollout=rollout, replica__base_url=urls[1])
    assert step.status == "rolled_back"
    assert "distance" in step.error and "above the tolerance 0.001" in step.error
    # The two replicas disagreed on the rollout that recorded the fingerprint:
    # which one was right is unknown, so it is not kept.
    assert not VersionFingerprint.objects.exists()


def test_every_replica_must_match_a_fingerprint_recorded_before(
    lena, deployment, approved_v1, urls
):
    replicas_sync(deployment)
    earlier = VersionFingerprint.objects.create(
        deployment=deployment,
        version=approved_v1,
        probe={"tokens": list("abcd"), "logprobs": [-1.0, -1.0, -1.0, -1.0]},
        recorded_from_url="http://earlier:8000",
    )

    rollout = promote(lena, deployment, approved_v1)

    assert rollout.status == "rolled_back"
    assert "Verification failed on 2 replica(s)" in rollout.error
    assert "recorded from http://earlier:8000" in rollout.error
    assert "distance inf: the greedy tokens differ" in rollout.error
    assert VersionFingerprint.objects.get().probe == earlier.probe


@pytest.mark.django_db(transaction=True)
def test_two_replicas_recording_at_once_cannot_both_win(root, lena, alex, legal, urls, tmp_path):
    deployment = make_deployment(root, urls, tmp_path / "volume", name="race")
    version = make_approved_version(lena, alex, make_adapter(lena, legal), AdapterSpec(seed=1))
    replicas = replicas_sync(deployment)
    probes = [Probe(("a",), (-1.0,)), Probe(("a",), (-2.0,))]
    barrier = threading.Barrier(2)
    results, errors = {}, []

    def record(index: int) -> None:
        try:
            barrier.wait(5)
            results[index] = fingerprint_compare(
                deployment=deployment,
                version_id=version.pk,
                replica=replicas[index],
                probe=probes[index],
            )
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=record, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)

    assert errors == []
    stored = VersionFingerprint.objects.get()
    winner = 0 if stored.recorded_from_id == replicas[0].pk else 1
    assert Probe.from_dict(stored.probe) == probes[winner]
    assert results[winner][1] == 0.0
    assert results[1 - winner][1] == 1.0
    assert {fingerprint.pk for fingerprint, _ in results.values()} == {stored.pk}


def test_the_reconcile_finds_stale_weights_and_loads_them_again(
    lena, deployment, approved_v1, fleet, urls
):
    rollout = promote(lena, deployment, approved_v1)
    load_stale(urls[1], rollout.served_path)
    right = probe(urls[0])
    assert probe(urls[1]) != right

    report = reconcile_deployment(deployment.pk, "beat")

    event = DriftEvent.objects.get()
    assert event.kind == "fingerprint_mismatch" and event.replica.base_url == urls[1]
    assert event.adapter_name == NAME and event.expected_root == rollout.served_path
    assert "distance" in event.detail and "it matches now" in event.detail
    assert report.repairs == [f"{urls[1]}: fingerprint_mismatch {NAME}"]
    assert probe(urls[1]) == right
    assert standin(fleet, urls[1]).adapters == {NAME: rollout.served_path}

    reconcile_deployment(deployment.pk, "beat")
    assert DriftEvent.objects.count() == 1


def test_a_persisting_mismatch_is_one_drift_event_counted_every_tick(
    lena, deployment, approved_v1, urls
):
    rollout = promote(lena, deployment, approved_v1)
    # A fingerprint no reload can match: every tick finds the mismatch again,
    # reloads, and still disagrees.
    VersionFingerprint.objects.filter(version=approved_v1).update(
        probe={"tokens": list("abcd"), "logprobs": [-1.0, -1.0, -1.0, -1.0]}
    )

    for _ in range(3):
        reconcile_deployment(deployment.pk, "beat")

    events = DriftEvent.objects.order_by("replica__base_url")
    assert [(e.replica.base_url, e.kind, e.count) for e in events] == [
        (urls[0], "repair_failed", 3),
        (urls[1], "repair_failed", 3),
    ]
    assert all(e.expected_root == rollout.served_path for e in events)
    assert "Reloading did not fix it" in events[0].detail


@pytest.mark.django_db(transaction=True)
def test_a_weight_repair_longer_than_a_claim_keeps_its_claims(
    settings, lena, deployment, approved_v1, urls, monkeypatch
):
    """The mismatch's reload is planned with the other repairs: the tick's
    thread renews the deployment's and the adapter's claims while it runs."""
    import serving.reconcile.repairs as reconcile
    from serving.models import Deployment, ServedAdapter

    rollout = promote(lena, deployment, approved_v1)
    load_stale(urls[1], rollout.served_path)
    # A 3 s claim, renewed every second, and a 4 s load: a 1 s claim lapsed while
    # the light run (niced beside vLLM) waited for the CPU, renewed late by a
    # starved heartbeat that was not stuck.
    settings.SERVING_CLAIM_SECONDS = 3.0
    expired, loads = [], []
    real = reconcile.reload_adapter

    def slow_load(client, name, path, policy, outcome):
        time.sleep(4.0)
        # Another thread, another connection: it sees only committed claims.
        now = timezone.now()
        row = Deployment.objects.get(pk=deployment.pk)
        if row.reconcile_lease_until is None or row.reconcile_lease_until < now:
            expired.append("deployment")
        held = ServedAdapter.objects.get(deployment=deployment)
        if held.lease_until is None or held.lease_until < now:
            expired.append("adapter")
        connections.close_all()
        loads.append(client.base_url)
        return real(client, name, path, policy, outcome)

    monkeypatch.setattr(reconcile, "reload_adapter", slow_load)
    report = reconcile_deployment(deployment.pk, "beat")

    assert report.repairs == [f"{urls[1]}: fingerprint_mismatch {NAME}"]
    assert loads == [urls[1]]
    assert expired == []
    assert probe(urls[1]) == probe(urls[0])


def test_a_deferred_replica_must_match_the_fingerprint_before_its_step_is_done(
    lena, deployment, approved_v1, urls
):
    # The second replica is down when the rollout starts, so it is deferred.
    Replica.objects.filter(pk=replicas_sync(deployment)[1].pk).update(health="down")
    rollout = promote(lena, deployment, approved_v1)
    assert rollout.status == "succeeded"
    step = ReplicaRollout.objects.get(rollout=rollout, replica__base_url=urls[1])
    assert step.status == "deferred"
    # It comes back serving the name from the right path, with other weights.
    load_stale(urls[1], rollout.served_path)

    # A step is done only if its verification matches the fingerprint, so it
    # must fail while the weights are stale.
    from serving.fanout import client_for, verify_with_fingerprint
    from serving.replica_calls import RetryPolicy

    fingerprint = Probe.from_dict(VersionFingerprint.objects.get().probe)
    with client_for(step.replica, deployment) as client:
        stale = verify_with_fingerprint(
            client,
            NAME,
            rollout.served_path,
            RetryPolicy(0, 0, 0),
            deployment=deployment,
            fingerprint=fingerprint,
        )
    assert not stale.ok and "serves other weights" in stale.error

    reconcile_deployment(deployment.pk, "beat")

    # The tick's weight check planned the reload with the other repairs, before
    # the deferred steps: the step is verified against the fingerprint that tick.
    assert DriftEvent.objects.filter(kind="fingerprint_mismatch").count() == 1
    step.refresh_from_db()
    assert step.status == "succeeded"


def test_the_sample_rotates_through_every_adapter(
    lena, alex, legal, deployment, fleet, urls, settings
):
    settings.SERVING_FINGERPRINT_SAMPLE = 2
    names = [f"adapter-{i}" for i in range(3)]
    for i, name in enumerate(names):
        adapter = make_adapter(lena, legal, name=name, served_name=name)
        version = make_approved_version(lena, alex, adapter, AdapterSpec(seed=10 + i))
        assert promote(lena, deployment, version).status == "succeeded"
    replicas = [standin(fleet, url) for url in urls]
    key = "completions:{}".format

    def probed_this_tick() -> list[list[str]]:
        before = [dict(r.calls) for r in replicas]
        reconcile_deployment(deployment.pk, "beat")
        return [
            sorted(n for n in names if r.calls.get(key(n), 0) > b.get(key(n), 0))
            for r, b in zip(replicas, before, strict=True)
        ]

    ticks = [probed_this_tick() for _ in range(3)]

    for replica in range(2):
        assert [tick[replica] for tick in ticks] == [
            ["adapter-0", "adapter-1"],
            ["adapter-0", "adapter-2"],
            ["adapter-1", "adapter-2"],
        ]
    assert DriftEvent.objects.count() == 0


def test_rotation_starts_after_the_last_name_checked_and_wraps():
    names = ["c", "a", "d", "b"]
    assert next_in_rotation(names, "", 2) == ["a", "b"]
    assert next_in_rotation(names, "b", 2) == ["c", "d"]
    assert next_in_rotation(names, "d", 3) == ["a", "b", "c"]
    # A name checked last that is gone since: the rotation goes on after it.
    assert next_in_rotation(["a", "c"], "b", 1) == ["c"]
    assert next_in_rotation(names, "a", 10) == ["b", "c", "d", "a"]


def test_the_state_shows_each_versions_fingerprint_and_only_admins_see_where_from(
    lena, root, deployment, approved_v1, urls
):
    promote(lena, deployment, approved_v1)
    stored = VersionFingerprint.objects.get()
    url = f"/api/v1/deployments/{deployment.name}/state/"

    as_member = client_for(lena).get(url).json()["desired"][0]["fingerprint"]
    as_admin = client_for(root).get(url).json()["desired"][0]["fingerprint"]

    assert as_member["tokens"] == stored.probe["tokens"]
    assert as_member["logprobs"] == stored.probe["logprobs"]
    assert "recorded_from" not in as_member
    assert as_admin["recorded_from"] == urls[0]


def test_the_deployment_page_says_whether_a_version_has_a_fingerprint(
    lena, deployment, approved_v1
):
    promote(lena, deployment, approved_v1)
    page = client_for(lena).get(f"/deployments/{deployment.name}/")
    assert page.status_code == 200
    assert b'data-testid="fingerprint-legal-contracts"' in page.content
    assert b"fingerprint</span> recorded" in page.content

    VersionFingerprint.objects.all().delete()
    page = client_for(lena).get(f"/deployments/{deployment.name}/")
    assert b"no fingerprint yet" in page.content


def test_the_admin_shows_fingerprints_and_changes_none(root, lena, deployment, approved_v1):
    promote(lena, deployment, approved_v1)
    fingerprint = VersionFingerprint.objects.get()
    admin = client_for(root)
    assert admin.get("/admin/serving/versionfingerprint/").status_code == 200
    change = admin.get(f"/admin/serving/versionfingerprint/{fingerprint.pk}/change/")
    assert change.status_code == 200 and b'name="probe"' not in change.content
    admin.post(f"/admin/serving/versionfingerprint/{fingerprint.pk}/delete/", {"post": "yes"})
    assert VersionFingerprint.objects.filter(pk=fingerprint.pk).exists()


def test_new_base_weights_forget_the_fingerprints_and_other_changes_keep_them(
    root, lena, deployment, approved_v1
):
    from serving.services.deployments import deployment_update

    promote(lena, deployment, approved_v1)
    deployment_update(actor=actor(root), deployment=deployment, description="Legal's models")
    assert VersionFingerprint.objects.count() == 1
    deployment_update(actor=actor(root), deployment=deployment, revision="2026-12-01")
    assert VersionFingerprint.objects.count() == 0


def test_a_replica_that_does_not_answer_the_probe_is_no_drift(
    root, lena, alex, legal, fake_replicas, tmp_path
):
    from serving.models import HttpAttempt

    deployment = make_deployment(
        root, [r.base_url for r in fake_replicas], tmp_path / "volume", name="fakes"
    )
    adapter = make_adapter(lena, legal, name="contracts", served_name=NAME)
    version = make_approved_version(lena, alex, adapter, AdapterSpec(seed=1))
    assert promote(lena, deployment, version).status == "succeeded"
    fake_replicas[1].fail_completion_for = {NAME}

    reconcile_deployment(deployment.pk, "beat")

    assert not DriftEvent.objects.exists()
    failed = HttpAttempt.objects.filter(purpose="fingerprint_check", ok=False)
    assert [a.replica.base_url for a in failed] == [fake_replicas[1].base_url]


@pytest.mark.django_db
def test_a_probe_with_any_characters_is_stored_and_read_back_exactly(deployment, approved_v1):
    """The tiny CPU model emits NUL among its tokens; PostgreSQL's jsonb refuses
    \\u0000, which failed the fingerprint's write and left the rollout verifying."""
    probe = Probe(
        ("", " the", "\x00", "back\\slash", "\u00e9\u4e2d", "\\x00"), (-1.0, -2, -3, -4, -5, -6)
    )
    VersionFingerprint.objects.create(
        deployment=deployment, version=approved_v1, probe=probe.as_dict()
    )
    stored = VersionFingerprint.objects.get(deployment=deployment, version=approved_v1)
    assert Probe.from_dict(stored.probe) == probe
    assert Probe.from_dict(stored.probe).distance(probe) == 0
