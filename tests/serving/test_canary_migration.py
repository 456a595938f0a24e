"""Serving 0022 moves the canary columns of rollouts and promotions into a row of
their own (Canary) and back: a baking traffic canary, a decided one, a person's
request not acted on yet, a canary without a share and one still awaiting its
approval all keep what they were."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from serving.models import Canary, CanaryState, Replica
from tests.factories import make_adapter, make_approved_version
from tests.support.adapters import AdapterSpec

BEFORE = ("serving", "0021_served_adapter_kept_copy")
AFTER = ("serving", "0022_canary_row")
UNTIL = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def migrate(target):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([target])
    return MigrationExecutor(connection).loader.project_state([target]).apps


@pytest.mark.django_db(transaction=True)
def test_the_canary_columns_move_into_their_own_row_and_back(lena, alex, legal, deployment):
    versions = [
        make_approved_version(
            lena, alex, make_adapter(lena, legal, name=f"a{i}"), AdapterSpec(seed=i + 1)
        )
        for i in range(5)
    ]
    replica = Replica.objects.create(deployment=deployment, base_url="http://canary.invalid:8000")
    leaves = MigrationExecutor(connection).loader.graph.leaf_nodes()
    old = migrate(BEFORE)
    Promotion, Rollout = old.get_model("serving", "Promotion"), old.get_model("serving", "Rollout")

    def made(version, status, **canary):
        promotion = Promotion.objects.create(
            deployment_id=deployment.pk,
            version_id=version.pk,
            status="approved",
            requested_by_id=lena.pk,
            canary=True,
            canary_share=canary.get("canary_share"),
            canary_bake_seconds=canary.get("canary_bake_seconds"),
        )
        return Rollout.objects.create(
            deployment_id=deployment.pk,
            adapter_id=version.adapter_id,
            target_version_id=version.pk,
            promotion=promotion,
            kind="swap",
            status=status,
            canary=True,
            **canary,
        )

    split = {"canary_share": 10, "canary_bake_seconds": 60}
    baking = made(
        versions[0],
        "baking",
        canary_replica_id=replica.pk,
        canary_bake_until=UNTIL,
        canary_gates={"counters": {"base": {}}},
        **split,
    )
    asked = made(
        versions[1],
        "baking",
        canary_request="abort",
        canary_requested_by_id=alex.pk,
        **split,
    )
    decided = made(versions[2], "rolled_back", canary_outcome="failed", **split)
    plain = made(versions[3], "succeeded")
    waiting = Promotion.objects.create(
        deployment_id=deployment.pk,
        version_id=versions[4].pk,
        status="pending_approval",
        requested_by_id=lena.pk,
        canary=True,
        **split,
    )

    migrate(AFTER)
    rows = {c.rollout_id or -c.promotion_id: c for c in Canary.objects.all()}
    assert len(rows) == 5
    row = rows[baking.pk]
    assert (row.state, row.share, row.bake_seconds, row.replica_id, row.bake_until) == (
        CanaryState.BAKING,
        10,
        60,
        replica.pk,
        UNTIL,
    )
    assert row.gates == {"counters": {"base": {}}}
    assert row.promotion_id == baking.promotion_id
    assert (rows[asked.pk].state, rows[asked.pk].decided_by_id) == (
        CanaryState.ABORT_ASKED,
        alex.pk,
    )
    assert (rows[asked.pk].outcome, rows[asked.pk].requested) == ("", "abort")
    assert rows[decided.pk].state == CanaryState.FAILED
    assert (rows[plain.pk].state, rows[plain.pk].share) == (CanaryState.PASSED, None)
    assert (rows[-waiting.pk].state, rows[-waiting.pk].rollout_id) == (CanaryState.WAITING, None)

    back = migrate(BEFORE)
    Rollout = back.get_model("serving", "Rollout")
    Promotion = back.get_model("serving", "Promotion")
    again = Rollout.objects.get(pk=baking.pk)
    assert (again.canary, again.canary_share, again.canary_bake_seconds) == (True, 10, 60)
    assert (again.canary_replica_id, again.canary_bake_until) == (replica.pk, UNTIL)
    assert again.canary_gates == {"counters": {"base": {}}}
    assert (again.canary_outcome, again.canary_request) == ("", "")
    again = Rollout.objects.get(pk=asked.pk)
    assert (again.canary_request, again.canary_requested_by_id) == ("abort", alex.pk)
    assert Rollout.objects.get(pk=decided.pk).canary_outcome == "failed"
    assert (Rollout.objects.get(pk=plain.pk).canary, plain.canary_share) == (True, None)
    assert Promotion.objects.get(pk=waiting.pk).canary_share == 10

    migrate_leaves = MigrationExecutor(connection)
    migrate_leaves.loader.build_graph()
    migrate_leaves.migrate(leaves)
