"""The serving endpoints: who may do what, the error format, and the views."""

import pytest

from serving.models import Rollout
from serving.rollouts.engine import rollout_execute
from serving.services.promotions import promotion_create
from tests.conftest import actor, client_for
from tests.serving.conftest import TINY_IDENTITY
from tests.support.authorization import CALLERS, caller_client

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "caller,expected",
    list(zip(CALLERS, [401, 403, 403, 403, 403, 201], strict=True)),
)
def test_only_platform_admins_create_deployments(
    caller, expected, fred, lena, alex, root, legal_token, fake_replicas, tmp_path
):
    client = caller_client(caller, fred, lena, alex, root, legal_token)
    body = {
        "name": "prod-legal-gpu",
        "environment": "production",
        "base_model_name": "tiny-llama",
        "replica_urls": [r.base_url for r in fake_replicas],
        "volume_write_path": str(tmp_path),
        "volume_serve_path": "/mnt/adapters",
        "vllm_api_key": "super-secret-key",
        **TINY_IDENTITY,
    }
    response = client.post("/api/v1/deployments/", body, format="json")
    assert response.status_code == expected
    if expected == 201:
        assert "vllm_api_key" not in response.json()
        assert response.json()["has_api_key"] is True
        assert "super-secret-key" not in response.content.decode()


@pytest.mark.parametrize(
    "caller,expected", list(zip(CALLERS, [401, 200, 200, 200, 200, 200], strict=True))
)
def test_everyone_signed_in_reads_deployments(
    caller, expected, deployment, fred, lena, alex, root, legal_token
):
    client = caller_client(caller, fred, lena, alex, root, legal_token)
    assert client.get("/api/v1/deployments/").status_code == expected
    assert client.get(f"/api/v1/deployments/{deployment.name}/").status_code == expected


@pytest.mark.parametrize(
    "caller,expected", list(zip(CALLERS, [401, 404, 201, 201, 201, 201], strict=True))
)
def test_promote_by_caller(
    caller, expected, deployment, approved_v1, fred, lena, alex, root, legal_token
):
    client = caller_client(caller, fred, lena, alex, root, legal_token)
    response = client.post(
        "/api/v1/promotions/",
        {"deployment": deployment.name, "version": approved_v1.pk},
        format="json",
    )
    assert response.status_code == expected, response.content
    if expected == 201:
        assert response.json()["status"] == "approved"
        assert response.json()["rollout"] == Rollout.objects.get().pk


@pytest.mark.parametrize(
    "caller,expected", list(zip(CALLERS, [401, 404, 403, 200, 403, 200], strict=True))
)
def test_approve_promotion_by_caller(
    caller, expected, deployment, approved_v1, paula, fred, lena, alex, root, legal_token
):
    deployment.requires_promotion_approval = True
    deployment.save()
    promotion = promotion_create(actor=actor(paula), deployment=deployment, version=approved_v1)
    client = caller_client(caller, fred, lena, alex, root, legal_token)
    response = client.post(f"/api/v1/promotions/{promotion.pk}/approve/")
    assert response.status_code == expected, response.content


def test_rollout_detail_shows_each_replica_and_every_attempt(
    as_lena, lena, deployment, approved_v1
):
    promotion = promotion_create(actor=actor(lena), deployment=deployment, version=approved_v1)
    rollout = promotion.rollouts.get()
    rollout_execute(rollout.pk, "w")

    body = as_lena.get(f"/api/v1/rollouts/{rollout.pk}/").json()

    assert body["status"] == "succeeded"
    assert body["served_name"] == "legal-contracts"
    assert len(body["replicas"]) == 2
    for replica in body["replicas"]:
        assert replica["status"] == "succeeded"
        purposes = [a["purpose"] for a in replica["attempts"]]
        assert "load" in purposes and "verify_completion" in purposes
        assert all(a["duration_ms"] >= 0 and a["status_code"] for a in replica["attempts"])


def test_outsiders_do_not_see_rollouts_or_served_adapters(as_fred, lena, deployment, approved_v1):
    promotion = promotion_create(actor=actor(lena), deployment=deployment, version=approved_v1)
    rollout = promotion.rollouts.get()
    rollout_execute(rollout.pk, "w")
    assert as_fred.get(f"/api/v1/rollouts/{rollout.pk}/").status_code == 404
    assert as_fred.get("/api/v1/rollouts/").json()["count"] == 0
    state = as_fred.get(f"/api/v1/deployments/{deployment.name}/state/").json()
    assert state["desired"] == []


def test_state_shows_desired_against_actual(as_lena, lena, deployment, approved_v1, fake_replicas):
    from serving.reconcile.tick import reconcile_deployment

    promotion = promotion_create(actor=actor(lena), deployment=deployment, version=approved_v1)
    rollout_execute(promotion.rollouts.get().pk, "w")
    fake_replicas[0].restart()
    fake_replicas[0].requests.clear()
    # Observe only: with the adapter's lease held, reconcile records but does not repair.
    from serving.models import ServedAdapter
    from serving.records.leases import served_adapter_claim

    served_adapter_claim(ServedAdapter.objects.get().pk, "someone")
    reconcile_deployment(deployment.pk, "beat")

    state = as_lena.get(f"/api/v1/deployments/{deployment.name}/state/").json()

    assert state["desired"][0]["version"] == 1
    in_sync = sorted(r["adapters"][0]["in_sync"] for r in state["replicas"])
    assert in_sync == [False, True]


def test_gate_preview(as_lena, deployment, approved_v1):
    body = as_lena.get(
        f"/api/v1/deployments/{deployment.name}/gate/?version={approved_v1.pk}"
    ).json()
    assert body["passed"] is True
    assert {c["name"] for c in body["checks"]} >= {"base_model", "rank", "capacity"}


def test_rollback_and_retire_endpoints(
    as_lena, lena, deployment, approved_v1, approved_v2, fake_replicas
):
    for version in (approved_v1, approved_v2):
        promotion = promotion_create(actor=actor(lena), deployment=deployment, version=version)
        rollout_execute(promotion.rollouts.get().pk, "w")

    back = as_lena.post(
        f"/api/v1/deployments/{deployment.name}/rollback/",
        {"adapter": approved_v1.adapter_id},
        format="json",
    )
    assert back.status_code == 202 and back.json()["target_version_number"] == 1
    rollout_execute(back.json()["id"], "w")

    retired = as_lena.post(
        f"/api/v1/deployments/{deployment.name}/retire/",
        {"adapter": approved_v1.adapter_id},
        format="json",
    )
    assert retired.status_code == 202 and retired.json()["kind"] == "retire"
    rollout_execute(retired.json()["id"], "w")
    assert all("legal-contracts" not in r.adapters for r in fake_replicas)

    again = as_lena.post(
        f"/api/v1/deployments/{deployment.name}/retire/",
        {"adapter": approved_v1.adapter_id},
        format="json",
    )
    assert again.status_code == 409 and again.json()["error"]["code"] == "not_served"


def test_deployment_from_a_base_model_config(as_root, tmp_path, fake_replicas):
    import json

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "hidden_size": 128,
                "intermediate_size": 256,
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "num_key_value_heads": 2,
                "vocab_size": 300,
            }
        )
    )
    response = as_root.post(
        "/api/v1/deployments/",
        {
            "name": "from-config",
            "base_model_name": "tiny-llama",
            "base_model_path": str(model),
            "replica_urls": [fake_replicas[0].base_url],
            "volume_write_path": str(tmp_path / "v"),
            "volume_serve_path": str(tmp_path / "v"),
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["architecture"] == "LlamaForCausalLM"
    assert body["module_dims"]["down_proj"] == [256, 128]
    assert str(model) in body["base_model_aliases"]


def test_bad_deployment_config_is_400_naming_the_problem(as_root, tmp_path):
    response = as_root.post(
        "/api/v1/deployments/",
        {
            "name": "broken",
            "base_model_name": "tiny-llama",
            "replica_urls": ["ftp://x"],
            "volume_write_path": str(tmp_path),
            "volume_serve_path": str(tmp_path),
        },
        format="json",
    )
    assert response.status_code == 400
    assert "ftp://x" in response.json()["error"]["message"]


@pytest.mark.parametrize("path", ["rollouts", "promotions", "versions", "adapters", "tokens"])
def test_a_non_numeric_id_is_404(as_lena, path):
    response = as_lena.get(f"/api/v1/{path}/null/")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_the_vllm_api_key_is_encrypted_at_rest_and_sent_to_replicas(
    as_root, root, tmp_path, settings
):
    from django.db import connection

    from serving.fanout import client_for
    from serving.models import Deployment
    from tests.support.vllm_standin import serve_standin

    fake = serve_standin()
    try:
        response = as_root.post(
            "/api/v1/deployments/",
            {
                "name": "keyed",
                "base_model_name": "tiny-llama",
                "replica_urls": [fake.base_url],
                "volume_write_path": str(tmp_path),
                "volume_serve_path": str(tmp_path),
                "vllm_api_key": "sk-vllm-very-secret",
                **TINY_IDENTITY,
            },
            format="json",
        )
        assert response.status_code == 201
        with connection.cursor() as cursor:
            cursor.execute("SELECT vllm_api_key FROM serving_deployment WHERE name = 'keyed'")
            (stored,) = cursor.fetchone()
        assert stored.startswith("fernet:") and "very-secret" not in stored

        deployment = Deployment.objects.get(name="keyed")
        assert deployment.vllm_api_key == "sk-vllm-very-secret"
        client = client_for(deployment.replicas.first() or _replica(deployment), deployment)
        assert client._api_key == "sk-vllm-very-secret"

        settings.FIELD_ENCRYPTION_KEY = "a-rotated-key"
        with pytest.raises(ValueError, match="cannot be decrypted"):
            Deployment.objects.get(name="keyed")
    finally:
        fake.close()


def _replica(deployment):
    from serving.replica_rows import replicas_sync

    return replicas_sync(deployment)[0]


@pytest.fixture
def production(deployment):
    deployment.requires_promotion_approval = True
    deployment.save()
    return deployment


def test_rollback_to_a_version_never_served_is_refused(
    as_lena, lena, production, approved_v1, approved_v2, alex
):
    """The four-eyes bypass: v2 was approved but never promoted here; rolling
    'back' to it would serve it on production without the promotion's approval."""
    promotion = promotion_create(actor=actor(lena), deployment=production, version=approved_v1)
    from serving.services.promotions import promotion_review

    promotion_review(actor=actor(alex), promotion=promotion, approve=True)
    rollout_execute(promotion.rollouts.get().pk, "w")
    before = Rollout.objects.count()

    response = as_lena.post(
        f"/api/v1/deployments/{production.name}/rollback/",
        {"adapter": approved_v2.adapter_id, "version": approved_v2.pk},
        format="json",
    )

    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "not_served_before"
    assert "use a promotion" in error["message"]
    assert Rollout.objects.count() == before


def test_rollback_to_a_version_served_before_is_allowed(
    as_lena, lena, deployment, approved_v1, approved_v2
):
    for version in (approved_v1, approved_v2):
        promotion = promotion_create(actor=actor(lena), deployment=deployment, version=version)
        rollout_execute(promotion.rollouts.get().pk, "w")
    response = as_lena.post(
        f"/api/v1/deployments/{deployment.name}/rollback/",
        {"adapter": approved_v1.adapter_id, "version": approved_v1.pk},
        format="json",
    )
    assert response.status_code == 202 and response.json()["target_version_number"] == 1


def test_a_promote_token_can_neither_retire_nor_roll_back(lena, legal, deployment, approved_v1):
    from core.services.tokens import token_create

    token, secret = token_create(
        actor=actor(lena), department=legal, name="ship-only", abilities=["deployments:promote"]
    )
    client = client_for("token", type("T", (), {"secret": secret}))
    promoted = client.post(
        "/api/v1/promotions/",
        {"deployment": deployment.name, "version": approved_v1.pk},
        format="json",
    )
    assert promoted.status_code == 201
    rollout_execute(promoted.json()["rollout"], "w")

    for path, ability in (("retire", "deployments:retire"), ("rollback", "deployments:rollback")):
        response = client.post(
            f"/api/v1/deployments/{deployment.name}/{path}/",
            {"adapter": approved_v1.adapter_id},
            format="json",
        )
        assert response.status_code == 403, path
        error = response.json()["error"]
        assert error["code"] == "missing_ability" and ability in error["message"]
    assert not Rollout.objects.filter(kind__in=["retire", "rollback"]).exists()


def test_the_token_refusal_message_says_what_tokens_cannot_do():
    from core.access import require_approver
    from core.errors import NotAuthorized

    class Token:
        department_id = 1

    class User:
        is_active, is_staff = True, False

        def get_username(self):
            return "x"

    with pytest.raises(NotAuthorized) as raised:
        require_approver(actor(User(), Token()), 1, "Version")
    assert "retire" not in raised.value.message and "approve" in raised.value.message


INFRASTRUCTURE = {
    "replica_urls",
    "replica_dns_name",
    "replica_port",
    "replica_scheme",
    "replicas",
    "volume_write_path",
    "volume_serve_path",
    "has_api_key",
}


def test_members_and_tokens_read_deployments_without_infrastructure(
    as_lena, as_token, as_root, deployment, fake_replicas, tmp_path
):
    for client in (as_lena, as_token):
        listed = client.get("/api/v1/deployments/").json()["results"]
        detail = client.get(f"/api/v1/deployments/{deployment.name}/")
        state = client.get(f"/api/v1/deployments/{deployment.name}/state/")
        assert [d["name"] for d in listed] == [deployment.name]
        assert not INFRASTRUCTURE & set(listed[0]) and not INFRASTRUCTURE & set(detail.json())
        for response in (detail, state):
            text = response.content.decode()
            assert str(tmp_path) not in text
            assert all(r.base_url not in text for r in fake_replicas)
    admin = as_root.get(f"/api/v1/deployments/{deployment.name}/").json()
    assert set(admin) >= INFRASTRUCTURE


def test_a_deployment_limited_to_other_departments_is_not_found_for_members(
    as_lena, as_fred, as_root, deployment, finance
):
    deployment.allowed_departments.set([finance])
    assert as_lena.get("/api/v1/deployments/").json()["results"] == []
    assert as_lena.get(f"/api/v1/deployments/{deployment.name}/").status_code == 404
    assert as_fred.get(f"/api/v1/deployments/{deployment.name}/").status_code == 200
    assert as_root.get(f"/api/v1/deployments/{deployment.name}/").status_code == 200


def test_drift_events_carry_their_count_and_last_sighting(
    as_root, as_lena, lena, deployment, approved_v1, fake_replicas
):
    from serving.reconcile.tick import reconcile_deployment

    promotion = promotion_create(actor=actor(lena), deployment=deployment, version=approved_v1)
    rollout_execute(promotion.rollouts.get().pk, "w")
    fake_replicas[0].restart()
    fake_replicas[0].fail_load = (500, "LoRA rank 64 is greater than max_lora_rank 16")
    reconcile_deployment(deployment.pk, "beat")
    reconcile_deployment(deployment.pk, "beat")

    url = f"/api/v1/deployments/{deployment.name}/drift-events/"
    (event,) = as_root.get(url).json()["results"]
    assert event["kind"] == "repair_failed" and event["count"] == 2
    assert event["last_seen_at"] > event["created_at"]
    (summary,) = as_lena.get(url).json()["results"]
    assert summary["count"] == 2 and "replica" not in summary
    replicas = as_root.get(f"/api/v1/deployments/{deployment.name}/").json()["replicas"]
    assert sorted(r["in_sync_polls"] for r in replicas) == [0, 1]
