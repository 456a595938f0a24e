"""Rollout logic against fake vLLM replicas (error paths). The same behaviours
are shown against real vLLM servers in tests/serving/vllm/."""

from pathlib import Path

import pytest

from serving.fanout import NO_EFFECT_RELOADS
from serving.models import HttpAttempt, Rollout, ServedAdapter
from serving.replica_calls import BASE_RECHECKS
from serving.rollouts.engine import rollout_execute
from serving.services.promotions import promotion_create, retire, rollback_to
from tests.conftest import actor

pytestmark = pytest.mark.django_db


def promote(user, deployment, version, **extra):
    promotion = promotion_create(actor=actor(user), deployment=deployment, version=version, **extra)
    return promotion, promotion.rollouts.get()


def test_promote_stages_loads_and_verifies_on_every_replica(
    lena, deployment, approved_v1, fake_replicas, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks() as callbacks:
        _, rollout = promote(lena, deployment, approved_v1)
    assert len(callbacks) == 1  # enqueued only after commit

    assert rollout_execute(rollout.pk, "w1") == "succeeded"

    rollout.refresh_from_db()
    expected = f"{deployment.volume_serve_path}/legal/contracts/v1-{approved_v1.sha8}"
    assert rollout.served_path == expected
    staged = Path(rollout.staged_path)
    assert sorted(p.name for p in staged.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    for replica in fake_replicas:
        assert replica.adapters == {"legal-contracts": expected}
    served = ServedAdapter.objects.get(deployment=deployment)
    assert served.version == approved_v1
    assert set(rollout.replica_steps.values_list("status", flat=True)) == {"succeeded"}
    purposes = set(HttpAttempt.objects.values_list("purpose", flat=True))
    assert {"version", "load", "verify_models", "verify_completion"} <= purposes


def test_rerunning_a_finished_rollout_changes_nothing(lena, deployment, approved_v1, fake_replicas):
    _, rollout = promote(lena, deployment, approved_v1)
    rollout_execute(rollout.pk, "w1")
    calls = sum(len(r.requests) for r in fake_replicas)
    assert rollout_execute(rollout.pk, "w2") == "succeeded"
    assert sum(len(r.requests) for r in fake_replicas) == calls


def test_swap_unloads_then_loads_on_vllm_0_32(
    lena, deployment, approved_v1, approved_v2, fake_replicas
):
    rollout_execute(promote(lena, deployment, approved_v1)[1].pk, "w")
    _, swap = promote(lena, deployment, approved_v2)
    assert swap.kind == "swap"
    assert rollout_execute(swap.pk, "w") == "succeeded"
    swap.refresh_from_db()
    assert swap.previous_version == approved_v2.adapter.versions.get(number=1)
    for replica in fake_replicas:
        assert replica.adapters["legal-contracts"].endswith(f"v2-{approved_v2.sha8}")
        paths = [path for _, path, _ in replica.requests]
        assert "/v1/unload_lora_adapter" in paths
        assert not any(body.get("load_inplace") for _, _, body in replica.requests)


def test_swap_uses_load_inplace_on_vllm_0_33(
    lena, deployment, approved_v1, approved_v2, fake_replicas
):
    for replica in fake_replicas:
        replica.version = "0.33.1"
    rollout_execute(promote(lena, deployment, approved_v1)[1].pk, "w")
    assert rollout_execute(promote(lena, deployment, approved_v2)[1].pk, "w") == "succeeded"
    for replica in fake_replicas:
        assert any(body.get("load_inplace") for _, _, body in replica.requests)
        assert "/v1/unload_lora_adapter" not in [p for _, p, _ in replica.requests]


def test_transient_503_is_retried_then_succeeds(
    lena, deployment, approved_v1, fake_replicas, settings
):
    # Retried within a deadline a starved run cannot reach: the light run is
    # niced beside vLLM, and serving's test deadline of 1 s ran out mid-retry.
    settings.SERVING_RETRY_DEADLINE_SECONDS = 60
    fake_replicas[1].unavailable = 3
    _, rollout = promote(lena, deployment, approved_v1)
    assert rollout_execute(rollout.pk, "w") == "succeeded"
    failures = HttpAttempt.objects.filter(status_code=503)
    assert failures.count() == 3
    assert all(a.transient for a in failures)


def test_permanent_validation_error_is_not_retried_and_rolls_back(
    lena, deployment, approved_v1, fake_replicas
):
    fake_replicas[1].fail_load = (500, "LoRA rank 64 is greater than max_lora_rank 16.")
    _, rollout = promote(lena, deployment, approved_v1)

    assert rollout_execute(rollout.pk, "w") == "rolled_back"

    rollout.refresh_from_db()
    assert "greater than max_lora_rank" in rollout.error
    assert HttpAttempt.objects.filter(purpose="load", status_code=500).count() == 1
    # Nothing was served before: the adapter is unloaded everywhere.
    assert all("legal-contracts" not in r.adapters for r in fake_replicas)
    assert ServedAdapter.objects.get(deployment=deployment).version is None


def test_failed_verification_puts_every_replica_back_on_the_previous_version(
    lena, deployment, approved_v1, approved_v2, fake_replicas
):
    rollout_execute(promote(lena, deployment, approved_v1)[1].pk, "w")
    v1_path = fake_replicas[0].adapters["legal-contracts"]
    fake_replicas[1].fail_completion_for = {"legal-contracts"}

    _, swap = promote(lena, deployment, approved_v2)
    assert rollout_execute(swap.pk, "w") == "rolled_back"

    swap.refresh_from_db()
    assert "Verification failed" in swap.error and "engine error" in swap.error
    assert "back on v1" in swap.error
    for replica in fake_replicas:
        assert replica.adapters["legal-contracts"] == v1_path
    assert ServedAdapter.objects.get(deployment=deployment).version.number == 1
    assert set(swap.replica_steps.values_list("status", flat=True)) == {"rolled_back"}


def test_canary_stops_before_touching_the_other_replicas(
    lena, deployment, approved_v1, fake_replicas
):
    # Replicas are ordered by URL; the canary is the first.
    canary, rest = sorted(fake_replicas, key=lambda r: r.base_url)
    canary.fail_completion_for = {"legal-contracts"}
    _, rollout = promote(lena, deployment, approved_v1, canary=True)
    assert rollout_execute(rollout.pk, "w") == "rolled_back"
    assert any(p == "/v1/load_lora_adapter" for _, p, _ in canary.requests)
    assert not any(p == "/v1/load_lora_adapter" for _, p, _ in rest.requests)
    rollout.refresh_from_db()
    assert rollout.canary.state == "ended"  # over before anything was decided


def test_a_canary_without_a_share_passes_on_its_replica_then_the_rest_follow(
    lena, deployment, approved_v1, fake_replicas
):
    first, rest = sorted(fake_replicas, key=lambda r: r.base_url)
    _, rollout = promote(lena, deployment, approved_v1, canary=True)
    assert rollout_execute(rollout.pk, "w") == "succeeded"
    rollout.refresh_from_db()
    canary = rollout.canary
    assert (canary.state, canary.share, canary.replica.base_url) == ("passed", None, first.base_url)
    assert canary.decided_by is None and canary.decided_at is not None
    assert any(p == "/v1/load_lora_adapter" for _, p, _ in rest.requests)


def test_a_base_answer_equal_to_the_adapters_is_asked_again_before_it_fails_a_replica(
    lena, deployment, approved_v1, fake_replicas
):
    # vLLM 0.32 on CPU runs base tokens batched with adapter requests through the
    # last LoRA slot: the base model's answer was the adapter's own, once.
    fake_replicas[0].base_as_adapter_once = {"legal-contracts"}
    _, rollout = promote(lena, deployment, approved_v1)
    assert rollout_execute(rollout.pk, "w") == "succeeded"
    attempts = HttpAttempt.objects.filter(replica_rollout__rollout=rollout, purpose="verify_base")
    by_replica = {r.base_url: 0 for r in fake_replicas}
    for attempt in attempts.select_related("replica"):
        by_replica[attempt.replica.base_url] += 1
    # Once, then twice more (two answers that agree, unlike the adapter's) there;
    # once on the other replica.
    assert by_replica == {fake_replicas[0].base_url: 3, fake_replicas[1].base_url: 1}


def test_an_adapter_that_answers_like_the_base_model_every_time_has_no_effect(
    lena, deployment, approved_v1, fake_replicas
):
    fake_replicas[0].no_effect = {"legal-contracts"}
    _, rollout = promote(lena, deployment, approved_v1)
    assert rollout_execute(rollout.pk, "w") == "rolled_back"
    rollout.refresh_from_db()
    assert "has no effect" in rollout.error
    attempts = HttpAttempt.objects.filter(
        replica_rollout__rollout=rollout,
        purpose="verify_base",
        replica__base_url=fake_replicas[0].base_url,
    )
    # Believed only after it held over fresh loads: each load's probe, and the
    # base model asked again each time.
    assert attempts.count() == (1 + NO_EFFECT_RELOADS) * (1 + BASE_RECHECKS)
    assert f"after each of {1 + NO_EFFECT_RELOADS} loads" in rollout.error
    unloads = HttpAttempt.objects.filter(
        replica_rollout__rollout=rollout, purpose="unload",
        replica__base_url=fake_replicas[0].base_url,
    )  # fmt: skip
    assert unloads.count() >= NO_EFFECT_RELOADS


def test_a_load_that_answers_like_the_base_model_once_is_loaded_again_not_rolled_back(
    lena, deployment, approved_v1, fake_replicas
):
    """vLLM can answer a name loaded again under a running request without its
    weights for a while (docs/upstream/vllm-cpu-reload-no-effect.md): one
    "no effect" verdict is checked by a fresh load before it is believed."""
    fake_replicas[0].stale_after_next_load = {"legal-contracts"}
    _, rollout = promote(lena, deployment, approved_v1)
    assert rollout_execute(rollout.pk, "w") == "succeeded"
    rollout.refresh_from_db()
    assert rollout.error == ""
    assert "legal-contracts" in fake_replicas[0].adapters
    loads = HttpAttempt.objects.filter(
        replica_rollout__rollout=rollout, purpose="load",
        replica__base_url=fake_replicas[0].base_url,
    )  # fmt: skip
    assert loads.count() == 2  # the rollout's load, then one more after the verdict


def test_an_adapter_that_changes_nothing_fails_verification(
    lena, deployment, approved_v1, fake_replicas
):
    for replica in fake_replicas:
        replica.no_effect = {"legal-contracts"}
    _, rollout = promote(lena, deployment, approved_v1)
    assert rollout_execute(rollout.pk, "w") == "rolled_back"
    rollout.refresh_from_db()
    assert "has no effect" in rollout.error and "base model" in rollout.error
    assert not any("legal-contracts" in replica.adapters for replica in fake_replicas)


def test_already_loaded_with_the_same_root_is_success(lena, deployment, approved_v1, fake_replicas):
    _, rollout = promote(lena, deployment, approved_v1)
    rollout_execute(rollout.pk, "w")
    Rollout.objects.filter(pk=rollout.pk).update(status="loading")
    rollout.refresh_from_db()
    assert rollout_execute(rollout.pk, "w") == "succeeded"


def test_a_busy_lease_makes_the_task_retry_later(lena, deployment, approved_v1):
    from serving.records.leases import served_adapter_claim
    from serving.rollouts.engine import LeaseBusy

    _, rollout = promote(lena, deployment, approved_v1)
    served = ServedAdapter.objects.get(deployment=deployment, adapter=approved_v1.adapter)
    assert served_adapter_claim(served.pk, "other-worker")
    with pytest.raises(LeaseBusy):
        rollout_execute(rollout.pk, "w")
    rollout.refresh_from_db()
    assert rollout.status == "pending"


def test_manual_rollback_goes_back_to_an_earlier_version(
    lena, deployment, approved_v1, approved_v2, fake_replicas
):
    rollout_execute(promote(lena, deployment, approved_v1)[1].pk, "w")
    rollout_execute(promote(lena, deployment, approved_v2)[1].pk, "w")

    back = rollback_to(actor=actor(lena), deployment=deployment, adapter=approved_v1.adapter)

    assert back.kind == "rollback" and back.target_version == approved_v1
    assert rollout_execute(back.pk, "w") == "succeeded"
    assert all(
        r.adapters["legal-contracts"].endswith(f"v1-{approved_v1.sha8}") for r in fake_replicas
    )


def test_retire_unloads_everywhere(lena, deployment, approved_v1, fake_replicas):
    rollout_execute(promote(lena, deployment, approved_v1)[1].pk, "w")
    gone = retire(actor=actor(lena), deployment=deployment, adapter=approved_v1.adapter)
    assert rollout_execute(gone.pk, "w") == "succeeded"
    assert all("legal-contracts" not in r.adapters for r in fake_replicas)


def test_deprecating_a_served_version_retires_it(
    lena, alex, deployment, approved_v1, fake_replicas
):
    from registry.services.versions import version_transition

    rollout_execute(promote(lena, deployment, approved_v1)[1].pk, "w")
    version_transition(actor=actor(alex), version=approved_v1, action="deprecate")

    retire_rollout = Rollout.objects.get(kind="retire")
    assert rollout_execute(retire_rollout.pk, "w") == "succeeded"
    assert all("legal-contracts" not in r.adapters for r in fake_replicas)
    assert ServedAdapter.objects.get(deployment=deployment).version is None


def test_the_state_view_shows_a_rollout_before_the_next_reconcile(
    lena, deployment, approved_v1, fake_replicas
):
    from serving.models import Replica

    _, rollout = promote(lena, deployment, approved_v1)
    rollout_execute(rollout.pk, "w")
    rollout.refresh_from_db()
    for replica in Replica.objects.filter(deployment=deployment):
        assert replica.loaded_adapters == [{"id": "legal-contracts", "root": rollout.served_path}]

    gone = retire(actor=actor(lena), deployment=deployment, adapter=approved_v1.adapter)
    rollout_execute(gone.pk, "w")
    assert all(r.loaded_adapters == [] for r in Replica.objects.filter(deployment=deployment))


def test_the_state_view_keeps_what_rollouts_running_at_once_added(
    lena, deployment, approved_v1, fake_replicas, monkeypatch
):
    """A rollout's note of what each replica serves is written from rows read
    again at the end, not from the list it read at its start: another rollout
    that finished in between keeps its adapter in the view."""
    from serving.models import Replica
    from serving.rollouts import engine as rollouts

    other = {"id": "finance-forecast", "root": "/volume/finance/forecast/v1-0000"}
    read_at_start = rollouts.replicas_sync

    def another_rollout_finishes_meanwhile(deployment):
        replicas = read_at_start(deployment)
        Replica.objects.filter(deployment=deployment).update(loaded_adapters=[other])
        return replicas

    monkeypatch.setattr(rollouts, "replicas_sync", another_rollout_finishes_meanwhile)
    _, rollout = promote(lena, deployment, approved_v1)
    assert rollout_execute(rollout.pk, "w") == "succeeded"
    rollout.refresh_from_db()
    mine = {"id": "legal-contracts", "root": rollout.served_path}
    for replica in Replica.objects.filter(deployment=deployment):
        assert replica.loaded_adapters == [other, mine]


def test_replica_rows_another_worker_just_made_are_found_not_made_again(deployment, monkeypatch):
    """The first rollouts of a new deployment start together: each reads no rows,
    and all but the first find the rows another one just made."""
    from serving.models import Deployment
    from serving.replica_rows import replicas_sync

    made = replicas_sync(deployment)

    class NothingYet:
        def all(self):
            return []

    monkeypatch.setattr(Deployment, "replicas", property(lambda self: NothingYet()))
    again = replicas_sync(deployment)
    assert [r.pk for r in again] == [r.pk for r in made]


def test_a_promotion_is_audited_before_its_rollout(lena, deployment, approved_v1):
    from core.models import AuditEvent

    promote(lena, deployment, approved_v1)
    actions = list(AuditEvent.objects.order_by("id").values_list("action", flat=True))
    assert actions[-2:] == ["promotion.requested", "rollout.promote"]


def test_the_end_of_a_retire_is_audited(lena, deployment, approved_v1, fake_replicas):
    from core.models import AuditEvent

    rollout_execute(promote(lena, deployment, approved_v1)[1].pk, "w")
    gone = retire(actor=actor(lena), deployment=deployment, adapter=approved_v1.adapter)
    assert rollout_execute(gone.pk, "w") == "succeeded"
    event = AuditEvent.objects.get(action="rollout.succeeded", object_id=str(gone.pk))
    assert event.details["kind"] == "retire" and event.details["failed_replicas"] == 0


def test_a_swap_back_to_a_fingerprinted_version_matches_the_fingerprint_without_the_base(
    lena, deployment, approved_v1, approved_v2, fake_replicas
):
    rollout_execute(promote(lena, deployment, approved_v1)[1].pk, "w")
    rollout_execute(promote(lena, deployment, approved_v2)[1].pk, "w")
    _, back = promote(lena, deployment, approved_v1)
    assert rollout_execute(back.pk, "w") == "succeeded"
    purposes = set(
        HttpAttempt.objects.filter(replica_rollout__rollout=back).values_list("purpose", flat=True)
    )
    assert "verify_completion" in purposes and "verify_base" not in purposes
