"""The rendered KServe ServingRuntime starts a real vLLM that serves the promoted set.

The desired state is made through the real services (promotions rolled out to
fake replicas, which stage the files on the adapter volume). Then the
container args of the rendered ServingRuntime start a real vLLM CPU server,
with the one path that differs on this machine mapped: the base-model mount
(/mnt/models) becomes the tiny model's folder. The adapter volume is mounted
where the deployment says vLLM sees it, which here is the volume folder
itself. The CPU-only settings of scripts/vllm/serve.sh (dtype, context, KV
cache) come first; every rendered flag comes after them, so it wins.
"""

from __future__ import annotations

import json

import pytest

from serving.kserve import MODEL_MOUNT, manifests
from serving.models import Replica
from serving.rollouts.engine import rollout_execute
from serving.services.deployments import deployment_update
from serving.services.promotions import promotion_create
from tests.conftest import actor
from tests.factories import make_adapter, make_approved_version
from tests.serving.vllm.conftest import SERVED_BASE, adapters_on, chat_through_openai
from tests.support.adapters import AdapterSpec
from tests.support.vllm_servers import VLLMServer

pytestmark = [pytest.mark.vllm, pytest.mark.django_db]


def promote(user, deployment, version) -> None:
    promotion = promotion_create(actor=actor(user), deployment=deployment, version=version)
    assert rollout_execute(promotion.rollouts.get().pk, "w") == "succeeded"


def mapped(args: list[str], model_dir) -> list[str]:
    out = []
    for arg in args:
        if arg.startswith("--port="):
            continue  # the test server's own port
        if arg == f"--model={MODEL_MOUNT}":
            arg = f"--model={model_dir}"
        out.append(arg)
    return out


def test_the_rendered_runtime_serves_every_promoted_adapter_at_its_root(
    root, lena, alex, deployment, fake_replicas, contracts, approved_v1, tiny_model, tmp_path
):
    deployment = deployment_update(
        actor=actor(root),
        deployment=deployment,
        base_model_pvc="pvc-tiny-llama",
        adapter_pvc="pvc-lora-adapters",
    )
    for fake in fake_replicas:
        Replica.objects.get_or_create(deployment=deployment, base_url=fake.base_url)
    promote(lena, deployment, approved_v1)
    promote(lena, deployment, make_approved_version(lena, alex, contracts, AdapterSpec(seed=7)))
    memos = make_adapter(lena, contracts.department, name="memos", served_name="legal-memos")
    promote(lena, deployment, make_approved_version(lena, alex, memos, AdapterSpec(seed=8)))

    runtime, _service, _policy = manifests(deployment)
    container = runtime["spec"]["containers"][0]
    args = container["args"]
    assert not any("lora-extra-vocab-size" in a for a in args)
    modules = [json.loads(a) for a in args[args.index("--lora-modules") + 1 :]]
    expected = {m["name"]: m["path"] for m in modules}
    assert set(expected) == {"legal-contracts", "legal-memos"}
    assert "/legal/contracts/v2-" in expected["legal-contracts"]
    mount = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}["lora-adapters"]
    assert all(path.startswith(mount + "/") for path in expected.values())

    server = VLLMServer(
        name="kserve-rendered",
        model_dir=tiny_model,
        served_name=SERVED_BASE,
        log_dir=tmp_path / "logs",
        extra_args=mapped(args, tiny_model),
        env={e["name"]: e["value"] for e in container["env"] if "value" in e},
    )
    # Generous: the machine's two cores are shared with other servers and tests.
    server.start_and_wait(timeout=300)
    try:
        assert adapters_on(server) == expected
        assert chat_through_openai(server.base_url, "legal-memos") is not None
    finally:
        server.stop()
