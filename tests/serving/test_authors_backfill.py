"""The migrations that added `author_ids` (registry 0009, serving 0016) fill it
for versions and promotions made before: from the registration token, and from
the audit log's submit and promotion events and the tokens they name. Without
it, an approver's pipeline work from before the upgrade would pass four-eyes."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from registry.models import AdapterVersion
from serving.models import Promotion
from tests.conftest import client_for
from tests.factories import archive_upload, make_adapter, make_approved_version, make_version
from tests.serving.conftest import make_deployment
from tests.support.adapters import AdapterSpec
from tests.support.authorization import service_account_token


def migrate(targets) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


@pytest.mark.django_db(transaction=True)
def test_the_backfill_names_every_person_behind_earlier_work(
    legal, lena, alex, paula, root, fake_replicas, tmp_path
):
    people = {"alex": alex, "paula": paula, "root": root}
    # alex created the account, paula minted its token.
    pipeline = client_for(
        "token", service_account_token("alex's account, paula's token", legal, people)
    )
    adapter = make_adapter(lena, legal, name="contracts")
    registered = pipeline.post(
        f"/api/v1/adapters/{adapter.pk}/versions/",
        {"files": [archive_upload()]},
        format="multipart",
    ).json()["id"]
    submitted = make_version(lena, adapter).pk
    assert pipeline.post(f"/api/v1/versions/{submitted}/submit/").status_code == 200
    gated = make_deployment(
        root,
        [r.base_url for r in fake_replicas],
        tmp_path / "gated",
        name="gated",
        requires_promotion_approval=True,
    )
    approved = make_approved_version(lena, root, adapter, AdapterSpec(seed=7))
    promoted = pipeline.post(
        "/api/v1/promotions/", {"deployment": gated.name, "version": approved.pk}, format="json"
    ).json()["id"]
    leaves = MigrationExecutor(connection).loader.graph.leaf_nodes()

    migrate([("registry", "0008_artifact_retention"), ("serving", "0015_served_adapter_retained")])
    migrate(leaves)

    svc = AdapterVersion.objects.get(pk=registered).registered_by_id
    assert set(AdapterVersion.objects.get(pk=registered).author_ids) == {svc, alex.pk, paula.pk}
    assert set(AdapterVersion.objects.get(pk=submitted).author_ids) == {
        lena.pk,
        svc,
        alex.pk,
        paula.pk,
    }
    assert set(Promotion.objects.get(pk=promoted).author_ids) == {svc, alex.pk, paula.pk}
