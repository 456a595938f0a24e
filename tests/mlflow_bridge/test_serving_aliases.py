"""Promotion, swap, rollback and retirement move the deployment's alias in the
real MLflow registry, so MLflow answers "what is in production?" correctly."""

from __future__ import annotations

import pytest

from mlflow_bridge.mirror import registered_model_name
from serving.services.promotions import promotion_create, retire, rollback_to
from tests.conftest import actor
from tests.factories import make_approved_version
from tests.serving.conftest import make_deployment
from tests.support.adapters import AdapterSpec
from tests.support.vllm_standin import serve_standin

pytestmark = pytest.mark.mlflow


@pytest.fixture
def replicas():
    fakes = [serve_standin(), serve_standin()]
    yield fakes
    for fake in fakes:
        fake.close()


@pytest.fixture
def on_commit(django_capture_on_commit_callbacks):
    return lambda: django_capture_on_commit_callbacks(execute=True)


def test_the_alias_follows_what_the_deployment_serves(
    mlflow_on,
    tracking,
    adapter,
    lena,
    alex,
    root,
    replicas,
    tmp_path,
    on_commit,
):
    deployment = make_deployment(
        root, [r.base_url for r in replicas], tmp_path / "vol", name="prod-legal-cpu"
    )
    with on_commit():
        v1 = make_approved_version(lena, alex, adapter, AdapterSpec(seed=31))
        v2 = make_approved_version(lena, alex, adapter, AdapterSpec(seed=32))
    name = registered_model_name(adapter)

    def alias():
        return tracking.get_registered_model(name).aliases.get("prod-legal-cpu")

    def mlflow_number(version):
        version.mlflow_mirror.refresh_from_db()
        return version.mlflow_mirror.model_version

    def done(rollout):
        # Tasks run eagerly here: the rollout ran when the request committed.
        rollout.refresh_from_db()
        assert rollout.status == "succeeded", rollout.error

    with on_commit():
        promotion = promotion_create(actor=actor(lena), deployment=deployment, version=v1)
    done(promotion.rollouts.get())
    assert alias() == mlflow_number(v1)

    with on_commit():
        swap = promotion_create(actor=actor(lena), deployment=deployment, version=v2)
    done(swap.rollouts.get())
    assert alias() == mlflow_number(v2)

    with on_commit():
        back = rollback_to(actor=actor(lena), deployment=deployment, adapter=adapter)
    done(back)
    assert alias() == mlflow_number(v1)

    with on_commit():
        gone = retire(actor=actor(lena), deployment=deployment, adapter=adapter)
    done(gone)
    assert alias() is None
