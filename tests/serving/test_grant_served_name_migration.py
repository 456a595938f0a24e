"""serving 0025 keeps on each grant the name it asked for: grants made before
it get their adapter's served name, so the lists, filters and 409s that now
read `served_name` see them as before."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from serving.models import AdapterGrant
from serving.services.grants import grant_request
from tests.conftest import actor


def migrate(targets) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


@pytest.mark.django_db(transaction=True)
def test_grants_made_before_get_their_adapters_served_name(fred, finance, contracts):
    grant = grant_request(
        actor=actor(fred),
        department=finance,
        served_name=contracts.served_name,
        expires_in_days=3,
        reason="invoice checks",
    )
    leaves = MigrationExecutor(connection).loader.graph.leaf_nodes()

    migrate([("serving", "0024_door_state")])
    migrate(leaves)

    assert AdapterGrant.objects.get(pk=grant.pk).served_name == "legal-contracts"
